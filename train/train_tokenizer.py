#!/usr/bin/env python3
"""train_tokenizer.py — byte-level BPE in Qwen2/Qwen3's tokenizer.json format, trained with Hugging Face
tokenizers on the KJV training text plus needle documents of training seeds.

Writes OUT/tokenizer.json and OUT/tokenizer_config.json. The vocabulary is `vocab_size` ids: the
BPE tokens (the 256 byte symbols first) followed by the ChatML specials <|endoftext|>, <|im_start|>,
<|im_end|> as added tokens, as Qwen places them after its BPE vocabulary. Merges are saved as
"a b" strings like Qwen's published tokenizer.json.

Usage: python3 train/train_tokenizer.py --config train/config.json --out train/out/tokenizer
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle  # noqa: E402

# Qwen2/Qwen3's pre-tokenizer pattern (contractions, letters with one leading non-letter, single
# digits, punctuation runs, newlines, spaces).
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def training_texts(cfg, root):
    """KJV training chapters plus `tokenizer_needle_docs` needle documents (training seeds/words)."""
    kjv = open(os.path.join(root, cfg["data"]["kjv_train"]), encoding="utf-8").read()
    for ch in kjv.split("\n\n"):
        yield ch
    spec = needle.load_spec()
    rng = random.Random(cfg["tokenizer"]["needle_seed"])
    for _ in range(cfg["tokenizer"]["needle_docs"]):
        seed = rng.randrange(spec["train_seed_range"][0], spec["train_seed_range"][1] + 1)
        d = rng.choice(spec["train_depth_percent"])
        r2, code = needle.draw(spec, seed, spec["train_words"])
        sents = [r2.choice(spec["fillers"]) for _ in range(20)]
        lines, _ = needle.assemble(spec, seed, d, code, sents, 20)
        yield "\n".join(lines) + "\n"


def count_upper(tok):
    return sum(1 for ch in tok if "A" <= ch <= "Z")


def prune_caps(tj, n_bpe):
    """Rewrite a trained byte-level BPE (tokenizer.json dict, merges as pairs or "a b" strings) so that
    no token holds two or more ASCII capitals: all-caps words (the needle code words, "LORD") are
    spelled with single capitals, so a held-out code word is made of the same kind of tokens as the
    training ones. Merges are kept in rank order, skipping those whose result has >= 2 capitals or
    whose parts were dropped, until n_bpe tokens remain with room for one merge "Ġ"+X for every
    capital X that has no such token yet; those are appended last (lowest priority). Ids: the 256
    byte symbols keep theirs, then one id per kept merge in order."""
    vocab = tj["model"]["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
    alphabet = sorted((t for t in vocab if len(t) == 1), key=lambda t: vocab[t])
    assert len(alphabet) == 256 and sorted(vocab[t] for t in alphabet) == list(range(256)), "unexpected alphabet"
    kept = {t: vocab[t] for t in alphabet}
    out = []
    caps = [chr(c) for c in range(ord("A"), ord("Z") + 1)]

    def need():
        return sum(1 for x in caps if "Ġ" + x not in kept)

    for a, b in merges:
        if len(kept) + need() >= n_bpe:
            break
        r = a + b
        if count_upper(r) >= 2 or a not in kept or b not in kept or r in kept:
            continue
        kept[r] = len(kept)
        out.append((a, b))
    for x in caps:
        if "Ġ" + x not in kept:
            kept["Ġ" + x] = len(kept)
            out.append(("Ġ", x))
    if len(kept) != n_bpe:
        raise SystemExit("train_tokenizer: pruning left %d tokens, expected %d (train a larger vocabulary)" % (len(kept), n_bpe))
    tj["model"]["vocab"] = kept
    tj["model"]["merges"] = [a + " " + b for a, b in out]
    return tj


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from tokenizers import Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from tokenizers import AddedToken

    root = os.path.dirname(os.path.abspath(__file__))
    cfg = json.load(open(a.config))
    vocab_size = cfg["tokenizer"]["vocab_size"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    n_bpe = vocab_size - len(SPECIALS)
    trainer = trainers.BpeTrainer(vocab_size=n_bpe + cfg["tokenizer"]["prune_margin"], min_frequency=2,
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(training_texts(cfg, root), trainer=trainer)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "tokenizer.json")
    tok.save(path)
    tj = prune_caps(json.load(open(path, encoding="utf-8")), n_bpe)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    tok = Tokenizer.from_file(path)
    if tok.get_vocab_size() != n_bpe:
        raise SystemExit("train_tokenizer: BPE vocabulary has %d tokens, expected %d" % (tok.get_vocab_size(), n_bpe))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(path)

    # Qwen's tokenizer.json writes merges as "a b" strings (byte-level symbols never contain a space).
    tj = json.load(open(path, encoding="utf-8"))
    merges = tj["model"]["merges"]
    if merges and isinstance(merges[0], list):
        assert all(" " not in p for m in merges for p in m)
        tj["model"]["merges"] = [m[0] + " " + m[1] for m in merges]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, indent=2)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    assert ids == {s: vocab_size - len(SPECIALS) + i for i, s in enumerate(SPECIALS)}, ids

    tc = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                                 "single_word": False, "special": True} for s in SPECIALS},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": cfg["model"]["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
    # report how the code words split (held-out words must be copied piece by piece)
    spec = needle.load_spec()
    t2 = Tokenizer.from_file(path)
    for w in spec["train_words"][:8] + spec["heldout_words"]:
        e = t2.encode("is %s-0123." % w)
        print("tokenizer: %-9s -> %s" % (w, e.tokens))
    print("tokenizer: vocab %d (%d BPE + %d specials), %d merges -> %s" % (
        t2.get_vocab_size(), n_bpe, len(SPECIALS), len(tj["model"]["merges"]), path))


if __name__ == "__main__":
    main()

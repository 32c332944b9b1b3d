#!/usr/bin/env python3
"""eval.py — held-out KJV perplexity, needle recall and logits dumps for a checkpoint or an exported
(MLX 4-bit, dequantized) model directory.

Perplexity: the held-out token stream is cut into windows of `window` tokens, each evaluated from
position 0; every token but a window's first is predicted; ppl = exp(mean NLL).
Recall: a case is recalled when the greedy continuation of its prompt is the token sequence of
" {code}" (teacher-forced: the argmax at each answer position equals the expected token, which is
exactly what greedy decoding would emit). That is a lower bound of the spec's text criterion (a
greedy continuation spelling the code with other tokens would also count there).

The token ids come from eval_data.json, written by train.py (which has the HF tokenizer):
  {"heldout_ids": [...], "cases": [{"seed", "length", "depth", "code", "prompt_ids", "answer_ids"}, ...]}

Usage:
  python3 train/eval.py --model models/default --data train/out/eval_data.json --out res.json
  python3 train/eval.py --ckpt train/out/ckpt --data ... [--logits-out F --logits-tokens 512]
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needle  # noqa: E402
from model import Qwen3  # noqa: E402


@torch.no_grad()
def perplexity(model, ids, window, device, batch=8, max_windows=None):
    """(mean NLL, ppl, predicted tokens) over non-overlapping windows of `window` tokens."""
    model.eval()
    wins = [ids[i:i + window] for i in range(0, len(ids), window)]
    wins = [w for w in wins if len(w) >= 2]
    if max_windows:
        wins = wins[:max_windows]
    tot, cnt = 0.0, 0
    for i in range(0, len(wins), batch):
        chunk = wins[i:i + batch]
        T = max(len(w) for w in chunk)
        x = torch.zeros(len(chunk), T, dtype=torch.long)
        y = torch.full((len(chunk), T), -100, dtype=torch.long)
        for r, w in enumerate(chunk):
            x[r, :len(w)] = torch.tensor(w)
            y[r, :len(w) - 1] = torch.tensor(w[1:])
        logits = model(x.to(device)).float()
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.to(device).view(-1), ignore_index=-100,
                               reduction="sum")
        tot += float(loss)
        cnt += int((y != -100).sum())
    return tot / cnt, math.exp(tot / cnt), cnt


@torch.no_grad()
def recall(model, cases, device, batch=16):
    """Fraction of cases whose teacher-forced argmax continuation equals answer_ids; and per case."""
    model.eval()
    hits = []
    for i in range(0, len(cases), batch):
        chunk = cases[i:i + batch]
        seqs = [c["prompt_ids"] + c["answer_ids"][:-1] for c in chunk]
        T = max(len(s) for s in seqs)
        x = torch.zeros(len(chunk), T, dtype=torch.long)
        for r, s in enumerate(seqs):
            x[r, :len(s)] = torch.tensor(s)
        logits = model(x.to(device))
        for r, c in enumerate(chunk):
            p = len(c["prompt_ids"])
            n = len(c["answer_ids"])
            pred = logits[r, p - 1:p - 1 + n].argmax(-1).tolist()
            hits.append(pred == c["answer_ids"])
    return sum(hits) / max(1, len(hits)), hits


def make_cases(spec, encode, lengths, n, base=None):
    """Held-out benchmark cases (exact token counts): seeds benchmark_seed_base + i, held-out words,
    depth uniform in 0..100 from the case's own generator (drawn after the code)."""
    base = spec["benchmark_seed_base"] if base is None else base
    count = lambda t: len(encode(t))  # noqa: E731
    out = []
    for L in lengths:
        for i in range(n):
            seed = base + i + (0 if L == lengths[0] else 100000 * lengths.index(L))
            import random
            depth = random.Random(seed * 7 + 1).randint(0, 100)
            c = needle.make_case(spec, seed, L, depth, spec["heldout_words"], count)
            prompt = c.prompt()
            ids = encode(prompt)
            full = encode(c.text())
            assert full[:len(ids)] == ids, "prompt tokens are not a prefix of the document's"
            ans = encode(" " + c.code)
            out.append({"seed": seed, "length": L, "depth": depth, "code": c.code, "n_fill": c.n_fill,
                        "needle_at": c.needle_at, "doc_tokens": len(full), "prompt_ids": ids, "answer_ids": ans})
    return out


def summarize_recall(model, cases, device):
    res = {}
    for L in sorted(set(c["length"] for c in cases)):
        cs = [c for c in cases if c["length"] == L]
        r, hits = recall(model, cs, device)
        res[str(L)] = {"recall": r, "cases": len(cs), "hits": sum(hits),
                       "missed_seeds": [c["seed"] for c, h in zip(cs, hits) if not h]}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="exported model directory (dequantized for evaluation)")
    ap.add_argument("--ckpt", help="checkpoint directory of train.py (float)")
    ap.add_argument("--data", required=True, help="eval_data.json from train.py")
    ap.add_argument("--out")
    ap.add_argument("--window", type=int, default=2048)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-recall", action="store_true")
    ap.add_argument("--no-ppl", action="store_true")
    ap.add_argument("--cases", type=int, default=0, help="use only the first N cases of each length")
    ap.add_argument("--logits-out", help="write float32 logits of every position of the first heldout tokens")
    ap.add_argument("--logits-tokens", type=int, default=512)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.model:
        from export_mlx import load_mlx_dir
        model, _ = load_mlx_dir(a.model)
        what = "4-bit export %s (dequantized, float32)" % a.model
    else:
        from export_mlx import load_ckpt
        sd, meta = load_ckpt(a.ckpt)
        model = Qwen3(meta["model"])
        model.load_state_dict(sd)
        what = "checkpoint %s (float32 from bf16 shards)" % a.ckpt
    model = model.float().to(a.device).eval()
    data = json.load(open(a.data))
    res = {"model": what, "device": a.device}
    t0 = time.time()
    if a.logits_out:
        ids = data["heldout_ids"][:a.logits_tokens]
        with torch.no_grad():
            lg = model(torch.tensor([ids], device=a.device))[0].float().cpu()
        lg.numpy().astype("<f4").tofile(a.logits_out)
        res["logits_out"] = {"file": a.logits_out, "tokens": len(ids), "vocab": lg.shape[1]}
    if not a.no_ppl:
        nll, ppl, n = perplexity(model, data["heldout_ids"], a.window, a.device, batch=4 if a.device == "cpu" else 8)
        res["heldout_kjv"] = {"nll": nll, "ppl": ppl, "tokens": n, "window": a.window}
    if not a.no_recall:
        cases = data["cases"]
        if a.cases:
            cases = [c for L in sorted(set(c["length"] for c in cases))
                     for c in [c for c in cases if c["length"] == L][:a.cases]]
        res["recall"] = summarize_recall(model, cases, a.device)
    res["seconds"] = time.time() - t0
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()

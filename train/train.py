#!/usr/bin/env python3
"""train.py — train the default model (Qwen3 architecture) on KJV text + needle documents.

Each step is a batch of `needle_rows + kjv_rows` rows of seq_len tokens:
  * needle rows: one training needle document (spec/needle.md: train words, train lengths, train
    depths, seeds drawn from train_seed_range) starting at position 0 (no BOS), then <|endoftext|>,
    then padding that carries no loss;
  * KJV rows: a window of seq_len+1 tokens at a random offset of the tokenized training text.
Loss: mean cross-entropy over every non-padding target. AdamW (decoupled weight decay on matrices),
linear warmup then cosine decay to min_lr_frac * lr, bf16 autocast, gradient clipping.

Length of the run: --steps N fixes it; otherwise the step count is set once, after 30 timed steps,
to fit time_budget_s (capped at max_steps), and recorded in the checkpoint and the log so the run
can be repeated with --steps. Checkpoints (every ckpt_every_s and at the end) are bf16 safetensors
shards below 16 MB plus meta.json; --resume DIR continues from one (weights and step; the AdamW
moments are not saved — they would not fit the transfer limits — and restart from zero).

Besides the checkpoint, writes OUT/eval_data.json: the held-out KJV token ids and the held-out needle
cases (token ids), which eval.py and the C-side checks read.

Usage:
  python3 train/train.py --config train/config.json --tokenizer train/out/tokenizer --out train/out
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eval as ev  # noqa: E402
import needle  # noqa: E402
import st  # noqa: E402
from model import Qwen3, n_params  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def log(*a):
    print("[%7.1fs]" % (time.time() - T0), *a, flush=True)


T0 = time.time()


def save_ckpt(model, ckdir, meta, shard_bytes=14 * 1024 * 1024):
    """bf16 shards (< shard_bytes each) + meta.json; written to temporary names, then renamed."""
    os.makedirs(ckdir, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).cpu() for k, v in model.state_dict().items()}
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        nb = sd[k].numel() * 2
        if cur and size + nb > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = sd[k]
        size += nb
    if cur:
        shards.append(cur)
    names = []
    for i, sh in enumerate(shards):
        name = "ckpt-%02d.safetensors" % i
        st.save(os.path.join(ckdir, name + ".tmp"), sh)
        os.replace(os.path.join(ckdir, name + ".tmp"), os.path.join(ckdir, name))
        names.append(name)
    meta = dict(meta, shards=names)
    with open(os.path.join(ckdir, "meta.json.tmp"), "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(os.path.join(ckdir, "meta.json.tmp"), os.path.join(ckdir, "meta.json"))


class ByteTok:
    """Stand-in tokenizer for --fake-tokenizer smoke tests without the tokenizers package."""

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text):
        return [b % (self.vocab - 3) for b in text.encode("utf-8")]


def main():
    global T0
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=os.path.join(HERE, "config.json"))
    ap.add_argument("--tokenizer", help="directory with tokenizer.json")
    ap.add_argument("--fake-tokenizer", action="store_true", help="bytes as ids (smoke tests only)")
    ap.add_argument("--py-tokenizer", action="store_true", help="use bpe.py instead of the tokenizers package")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ckpt-dir", help="default OUT/ckpt")
    ap.add_argument("--resume")
    ap.add_argument("--steps", type=int, help="fixed number of steps of this run (overrides the time budget)")
    ap.add_argument("--new-schedule", action="store_true",
                    help="with --resume: a fresh warmup + cosine schedule over this run's steps")
    ap.add_argument("--time-budget", type=float)
    ap.add_argument("--eval-data", help="reuse this eval_data.json (held-out cases) instead of building it")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--override", action="append", default=[], help="section.key=json, e.g. train.lr=0.001")
    a = ap.parse_args()
    T0 = time.time()
    cfg = json.load(open(a.config))
    for o in a.override:
        k, v = o.split("=", 1)
        sec, key = k.split(".")
        cfg[sec][key] = json.loads(v)
    tc, mc = cfg["train"], dict(cfg["model"])
    os.makedirs(a.out, exist_ok=True)
    ckdir = a.ckpt_dir or os.path.join(a.out, "ckpt")
    dev = a.device
    torch.manual_seed(tc["seed"])
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)

    # ---- tokenizer and data
    if a.fake_tokenizer:
        tok = ByteTok(mc["vocab_size"])
        encode = tok.encode
        eot = mc["vocab_size"] - 3
    elif a.py_tokenizer:
        from bpe import BPE
        tok = BPE(os.path.join(a.tokenizer, "tokenizer.json"))
        encode = tok.encode
        eot = tok.added["<|endoftext|>"]
    else:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
        encode = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
        eot = tok.token_to_id("<|endoftext|>")
        assert tok.get_vocab_size() == mc["vocab_size"], (tok.get_vocab_size(), mc["vocab_size"])
    spec = needle.load_spec()
    kjv = open(os.path.join(HERE, cfg["data"]["kjv_train"]), encoding="utf-8").read()
    kjv_ids = torch.tensor(encode(kjv), dtype=torch.long)
    held_ids = encode(open(os.path.join(HERE, cfg["data"]["kjv_heldout"]), encoding="utf-8").read())
    log("kjv train tokens %d (%.2f bytes/token), heldout tokens %d" % (len(kjv_ids), len(kjv.encode()) / len(kjv_ids), len(held_ids)))
    cache = needle.LineCache(spec, encode, max_lines=400)

    # the line-additive construction must equal exact tokenization (else fall back to exact)
    exact_mode = False
    chk = random.Random(99)
    for i in range(200):
        seed = chk.randrange(0, 10 ** 9)
        L = chk.choice(spec["train_lengths"])
        d = chk.choice(spec["train_depth_percent"])
        ids, n, at, code, sents = cache.make(seed, L, d, needle.TRAIN_POOL)
        lines, at2 = needle.assemble(spec, seed, d, code, sents, n)
        text = "\n".join(lines) + "\n"
        ref = encode(text)
        if i < 20 and not a.fake_tokenizer:
            c = needle.make_case(spec, seed, L, d, needle.TRAIN_POOL, lambda t: len(encode(t)))
            if c.text() != text:
                log("needle: exact construction differs from the line cache for seed %d" % seed)
                exact_mode = True
        if ref != ids or at != at2 or len(ids) > L:
            log("needle: line-additive tokens differ from exact ones for seed %d: using exact mode" % seed)
            exact_mode = True
            break
    log("needle: line-additive construction %s" % ("REJECTED" if exact_mode else "verified on 200 documents"))

    def needle_doc(rng, lengths):
        seed = rng.randrange(spec["train_seed_range"][0], spec["train_seed_range"][1] + 1)
        L = rng.choice(lengths)
        d = rng.choice(spec["train_depth_percent"])
        if not exact_mode:
            return cache.make(seed, L, d, needle.TRAIN_POOL)[0]
        c = needle.make_case(spec, seed, L, d, needle.TRAIN_POOL, lambda t: len(encode(t)))
        return encode(c.text())

    # held-out evaluation data (token ids) for eval.py and the C engine
    t1 = time.time()
    if a.eval_data:
        with open(a.eval_data) as f:
            edata = json.load(f)
        ecases = edata["cases"]
        assert edata["heldout_ids"] == held_ids, "--eval-data: its held-out KJV ids differ from this tokenizer's"
    else:
        ecases = ev.make_cases(spec, encode, spec["heldout_lengths"], cfg["eval"]["cases_per_length"])
    with open(os.path.join(a.out, "eval_data.json"), "w") as f:
        json.dump({"heldout_ids": held_ids, "cases": ecases, "eot": eot}, f)
    log("eval data: %d cases in %.1fs; doc tokens min/max %d/%d" % (
        len(ecases), time.time() - t1, min(c["doc_tokens"] for c in ecases), max(c["doc_tokens"] for c in ecases)))
    small_cases = [c for L in spec["heldout_lengths"] for c in [c for c in ecases if c["length"] == L][:tc["eval_cases"]]]

    # ---- model
    mc["dropout"] = tc["dropout"]
    model = Qwen3(mc)
    start_step, total_steps = 0, a.steps
    resumed_history = []
    if a.resume:
        from export_mlx import load_ckpt
        sd, meta = load_ckpt(a.resume)
        model.load_state_dict(sd)
        start_step = meta["step"]
        resumed_history = meta.get("history", [])
        if total_steps is not None:
            total_steps += start_step
        elif not a.new_schedule and meta.get("total_steps", 0) > start_step:
            total_steps = meta["total_steps"]
        log("resumed from %s at step %d" % (a.resume, start_step))
    else:
        model.init_weights(tc["seed"])
    model.to(dev)
    log("model: %d parameters" % n_params(model))
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt_kw = {"fused": True} if dev == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tc["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tc["lr"], betas=(tc["beta1"], tc["beta2"]), eps=1e-8, **opt_kw)

    T, TS = tc["seq_len"], tc["short_seq_len"]
    RS, RL, RK = tc["short_rows"], tc["long_rows"], tc["kjv_rows"]
    short_lengths = [L for L in spec["train_lengths"] if L <= TS]
    long_lengths = [L for L in spec["train_lengths"] if L > TS]
    log("batch: %d rows x %d (needle lengths %s), %d rows x %d (needle lengths %s), %d KJV rows x %d" % (
        RS, TS, short_lengths, RL, T, long_lengths, RK, T))
    rng = random.Random(tc["seed"] * 1000003 + start_step)
    gen = torch.Generator().manual_seed(tc["seed"] * 7919 + start_step)

    answer_only = tc.get("answer_only_loss", False)
    prefix = list(cache.answer_prefix)

    def answer_start(ids):
        """Index of the first answer token (after the last 'Answer:')."""
        for a in range(len(ids) - len(prefix), -1, -1):
            if ids[a:a + len(prefix)] == prefix:
                return a + len(prefix)
        return 0

    def rows(n, width, lengths):
        """n needle rows of `width` inputs: a document from position 0, <|endoftext|>, unscored padding.
        With train.answer_only_loss only the answer ' CODE.' and what follows it are scored."""
        x = torch.full((n, width + 1), eot, dtype=torch.long)
        m = torch.zeros((n, width), dtype=torch.bool)
        for r in range(n):
            ids = needle_doc(rng, lengths)[:width] + [eot]
            x[r, :len(ids)] = torch.tensor(ids)
            m[r, (max(0, answer_start(ids) - 1) if answer_only else 0):len(ids) - 1] = True
        return x, m

    RC = tc.get("copy_rows", 0)
    heldout_upper = [w.upper() for w in spec["heldout_words"]]
    letters = [chr(c) for c in range(ord("A"), ord("Z") + 1)]

    def copy_rows(n, width):
        """n copy rows (not needle documents): a KJV window with the line "Name: S." inserted at a
        random place and repeated at the end, S a random string of 3-8 capitals that contains no
        held-out code word. Teaches copying capitals letter by letter (see docs/training.md)."""
        x = torch.full((n, width + 1), eot, dtype=torch.long)
        m = torch.zeros((n, width), dtype=torch.bool)
        for r in range(n):
            while True:
                name = "".join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
                if not any(w in name for w in heldout_upper):
                    break
            line = encode("\nName: %s.\n" % name)
            body = width + 1 - 2 * len(line)
            a0 = rng.randrange(0, len(kjv_ids) - body - 1)
            cut = rng.randint(0, (body * 3) // 4)
            ids = kjv_ids[a0:a0 + cut].tolist() + line + kjv_ids[a0 + cut:a0 + body].tolist() + line
            x[r, :len(ids)] = torch.tensor(ids)
            m[r, :len(ids) - 1] = True
        return x, m

    def batches():
        """[(inputs, targets)]: the short needle rows (and copy rows), then the long needle rows with
        the KJV rows."""
        out = []
        if RS:
            xs, ms = rows(RS, TS, short_lengths)
            if RC:
                xc, mc_ = copy_rows(RC, TS)
                xs, ms = torch.cat([xs, xc]), torch.cat([ms, mc_])
            out.append((xs, ms))
        x, m = rows(RL, T, long_lengths) if RL else (torch.zeros((0, T + 1), dtype=torch.long), torch.zeros((0, T), dtype=torch.bool))
        if RK:
            offs = torch.randint(0, len(kjv_ids) - T - 1, (RK,), generator=gen)
            xk = torch.stack([kjv_ids[o:o + T + 1] for o in offs.tolist()])
            x, m = torch.cat([x, xk]), torch.cat([m, torch.ones((RK, T), dtype=torch.bool)])
        if len(x):
            out.append((x, m))
        res = []
        for x, m in out:
            y = x[:, 1:].clone()
            y[~m] = -100
            res.append((x[:, :-1], y))
        return res

    seg0 = start_step if a.new_schedule else 0   # where the LR schedule starts

    def lr_at(step):
        step, total = step - seg0, total_steps - seg0
        if step < tc["warmup_steps"]:
            return tc["lr"] * (step + 1) / tc["warmup_steps"]
        p = min(1.0, (step - tc["warmup_steps"]) / max(1, total - tc["warmup_steps"]))
        return tc["lr"] * (tc["min_lr_frac"] + (1 - tc["min_lr_frac"]) * 0.5 * (1 + math.cos(math.pi * p)))

    budget = a.time_budget if a.time_budget is not None else tc["time_budget_s"]
    if total_steps is None:
        total_steps = tc["max_steps"]    # provisional until timed
        timed = False
    else:
        timed = True
    meta_base = {"model": {k: v for k, v in mc.items() if k != "dropout"}, "config": cfg}
    t_train = time.time()
    last_ck = time.time()
    step = start_step
    loss_acc, loss_n = 0.0, 0
    history = list(resumed_history)

    def periodic_eval(tag):
        model.eval()
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
            nll, ppl, _ = ev.perplexity(model, held_ids, T, dev, max_windows=8)
            rec = ev.summarize_recall(model, small_cases, dev)
        model.train()
        h = {"step": step, "tag": tag, "heldout_nll": nll, "heldout_ppl": ppl,
             "recall": {k: v["recall"] for k, v in rec.items()}, "time": time.time() - t_train}
        history.append(h)
        log("eval %s step %d: heldout ppl %.2f (nll %.4f), recall(bf16, %d cases) %s" % (
            tag, step, ppl, nll, tc["eval_cases"], json.dumps(h["recall"])))

    model.train()
    while step < total_steps:
        parts = batches()
        n_tok = sum(int((y != -100).sum()) for _, y in parts)
        parts = [(x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)) for x, y in parts]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss = 0.0
        for x, y in parts:
            with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
                logits = model(x)
            lp = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1), ignore_index=-100,
                                 reduction="sum") / n_tok
            lp.backward()
            loss = loss + lp.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc["grad_clip"])
        opt.step()
        step += 1
        if step % 50 == 0 or step == start_step + 1:
            lv = float(loss)
            loss_acc += lv
            loss_n += 1
            log("step %d/%d loss %.4f lr %.2e" % (step, total_steps, lv, lr_at(step)))
        if not timed and step == start_step + 30:
            if dev == "cuda":
                torch.cuda.synchronize()
            t_a = time.time()
        if not timed and step == start_step + 60:
            if dev == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - t_a) / 30
            left = budget - (time.time() - t_train)
            # leave room for the periodic evaluations (about 1% of steps' time each)
            total_steps = min(tc["max_steps"], step + int(left / (per * 1.04)))
            timed = True
            log("timing: %.1f ms/step, %d tokens/step -> total_steps %d (budget %.0fs)" % (
                per * 1000, (RS + RC) * TS + (RL + RK) * T, total_steps, budget))
        if tc["eval_every"] and step % tc["eval_every"] == 0:
            periodic_eval("periodic")
        if time.time() - last_ck > tc["ckpt_every_s"]:
            save_ckpt(model, ckdir, dict(meta_base, step=step, total_steps=total_steps, history=history))
            last_ck = time.time()
            log("checkpoint at step %d -> %s" % (step, ckdir))
    train_s = time.time() - t_train
    periodic_eval("final")
    save_ckpt(model, ckdir, dict(meta_base, step=step, total_steps=total_steps, history=history,
                                 train_seconds=train_s))
    log("done: %d steps in %.1fs -> %s" % (step, train_s, ckdir))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""compare_logits.py — compare two raw float32 logits dumps [N][vocab] (e.g. the C engine's from
train/ppl_c.c and PyTorch's from eval.py --logits-out, on the same token ids).

Prints JSON: relative L2 error ||a-b|| / ||b|| over all rows (b is the reference), the largest
per-row relative error, the largest absolute difference, and the top-1 (argmax) agreement.
Usage: python3 train/compare_logits.py A.bin REF.bin --vocab 4096
"""
import argparse
import json

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("ref")
    ap.add_argument("--vocab", type=int, required=True)
    x = ap.parse_args()
    a = np.fromfile(x.a, dtype="<f4").reshape(-1, x.vocab).astype(np.float64)
    b = np.fromfile(x.ref, dtype="<f4").reshape(-1, x.vocab).astype(np.float64)
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    row = np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)
    print(json.dumps({
        "rows": n,
        "rel_l2": float(np.linalg.norm(a - b) / np.linalg.norm(b)),
        "max_row_rel_l2": float(row.max()),
        "max_abs_diff": float(np.abs(a - b).max()),
        "top1_agreement": float((a.argmax(1) == b.argmax(1)).mean()),
    }))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""make_corpus.py — the King James Bible text of the training corpus, split into train and held-out.

Input: the output of `bible -l0 Gen1:1-Rev22:21` (Debian package bible-kjv), as a file or on stdin.
That text is a blank line, "Book N", a blank line, then one verse per line as "  V text".

Output (in --out, default train/data):
  kjv_train.txt    every chapter whose index (0-based, canonical order) is not 49 mod 50
  kjv_heldout.txt  chapters 49, 99, 149, ... (every 50th chapter: 23 of the 1189 chapters)
  corpus.json      counts and the SHA-256 of the input and outputs

Each chapter becomes "Book N\n" followed by its verses, one per line, without verse numbers.
Chapters are separated by one empty line. Only the standard library is used.
"""
import argparse
import hashlib
import json
import os
import re
import sys


def parse_chapters(text):
    """Return [(heading, [verse text, ...]), ...] in the order of the input."""
    chapters = []
    verse_re = re.compile(r"^\s+(\d+)\s+(.*\S)\s*$")
    for line in text.split("\n"):
        if not line.strip():
            continue
        m = verse_re.match(line)
        if m:
            if not chapters:
                raise SystemExit("make_corpus: verse before any chapter heading: %r" % line[:60])
            chapters[-1][1].append(m.group(2))
        else:
            chapters.append((line.strip(), []))
    return chapters


def chapter_text(ch):
    heading, verses = ch
    return heading + "\n" + "".join(v + "\n" for v in verses)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input", nargs="?", help="bible -l0 output (default: stdin)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    ap.add_argument("--heldout-every", type=int, default=50)
    a = ap.parse_args()
    raw = open(a.input, encoding="utf-8").read() if a.input else sys.stdin.read()
    chapters = parse_chapters(raw)
    if len(chapters) != 1189:
        raise SystemExit("make_corpus: expected 1189 chapters, got %d" % len(chapters))
    train, held = [], []
    for i, ch in enumerate(chapters):
        (held if i % a.heldout_every == a.heldout_every - 1 else train).append(chapter_text(ch))
    os.makedirs(a.out, exist_ok=True)
    info = {"input_sha256": hashlib.sha256(raw.encode("utf-8")).hexdigest(), "chapters": len(chapters),
            "heldout_every": a.heldout_every}
    for name, parts in (("kjv_train.txt", train), ("kjv_heldout.txt", held)):
        txt = "\n".join(parts)
        with open(os.path.join(a.out, name), "w", encoding="utf-8") as f:
            f.write(txt)
        info[name] = {"chapters": len(parts), "bytes": len(txt.encode("utf-8")),
                      "sha256": hashlib.sha256(txt.encode("utf-8")).hexdigest()}
    info["heldout_headings"] = [chapters[i][0] for i in range(len(chapters))
                                if i % a.heldout_every == a.heldout_every - 1]
    with open(os.path.join(a.out, "corpus.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps({k: v for k, v in info.items() if k != "heldout_headings"}))


if __name__ == "__main__":
    main()

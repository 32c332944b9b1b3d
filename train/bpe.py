#!/usr/bin/env python3
"""bpe.py — a small pure-Python reader of this project's tokenizer.json (byte-level BPE, Qwen format),
for machines without the `tokenizers` package: encode (NFC, added tokens, Qwen's Split regex,
byte-to-unicode map, merges by rank) and decode. Needs the `regex` module (Debian python3-regex).
It covers what train_tokenizer.py writes, not every tokenizer.json feature.
"""
import json
import unicodedata

import regex


def bytes_to_unicode():
    """GPT-2's map of the 256 bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class BPE:
    def __init__(self, path):
        tj = json.load(open(path, encoding="utf-8"))
        self.vocab = tj["model"]["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
        self.rank = {m: i for i, m in enumerate(merges)}
        pat = None
        for p in tj["pre_tokenizer"]["pretokenizers"]:
            if p["type"] == "Split":
                pat = p["pattern"]["Regex"]
        self.pat = regex.compile(pat)
        self.added = {t["content"]: t["id"] for t in tj["added_tokens"]}
        self.inv = {v: k for k, v in self.vocab.items()}
        for k, v in self.added.items():
            self.inv[v] = k
        self.b2u = bytes_to_unicode()
        self.u2b = {v: k for k, v in self.b2u.items()}
        self.cache = {}

    def _bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        ids = [self.vocab[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        out = []
        if self.added:
            split = regex.split("(" + "|".join(regex.escape(a) for a in self.added) + ")", text)
        else:
            split = [text]
        for seg in split:
            if seg in self.added:
                out.append(self.added[seg])
                continue
            seg = unicodedata.normalize("NFC", seg)
            for piece in self.pat.findall(seg):
                out += self._bpe("".join(self.b2u[b] for b in piece.encode("utf-8")))
        return out

    def token_bytes(self, i):
        t = self.inv[i]
        if t in self.added:
            return t.encode("utf-8")
        return bytes(self.u2b[c] for c in t)

    def decode(self, ids):
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

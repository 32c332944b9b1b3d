# gemma4_lib.sh — sourced by t_gemma4.sh and t_gemma4_moe.sh (after BIN, T, ok and bad are set):
#   ref_python               sets PY to a python3 with numpy (empty when there is none)
#   reference_case M LEN S   generate 24 tokens on model dir $T/M after a LEN-token prompt (sampling
#                            flags S, may be empty), and check its logits against tests/gemma4_ref.py's
#                            float64 forward pass; the same rows one position off must fail
#   make_prompts             $PF: ten prompts of 1..150 bytes; $T/prompts.rev: the same, reversed
#   gen M FLAGS...           generate --json for every prompt of $PF on model M
#   unindex FILE...          --json lines without their "index" field (to compare reordered runs)

ref_python() {
    PY=""
    for p in python3 /usr/bin/python3; do "$p" -c "import numpy" 2>/dev/null && { PY=$p; return; }; done
}

reference_case() {
    local m=$1 len=$2 s=$3 ids gen out
    ids=$(seq 7 $((6 + len)) | awk '{print ($1 * 37) % 300}' | paste -sd,)
    # shellcheck disable=SC2086
    "$BIN" generate -m "$T/$m" --prompt-ids "$ids" -n 24 --ignore-eos $s --json --logits-out "$T/l.bin" \
        > "$T/o.json" 2>/dev/null || { bad "generate for the reference ($m $len $s)"; return; }
    gen=$(grep -o '"tokens":\[[0-9,]*\]' "$T/o.json" | grep -o '[0-9,]*' | sed 's/^,//')
    out=$("$PY" tests/gemma4_ref.py "$T/$m" "$ids,$gen" "$T/l.bin" $((len - 1)) 2>&1)
    echo "$out" | grep -q " ok$" && ok || bad "reference, $m prompt $len $s: $out"
    # the comparison can fail: the same rows against the reference one position off
    out=$("$PY" tests/gemma4_ref.py "$T/$m" "$ids,$gen" "$T/l.bin" $((len - 2)) 2>&1)
    echo "$out" | grep -q "FAIL" && ok || bad "reference one position off still passes ($m $len $s): $out"
}

make_prompts() {
    PF=$T/prompts.txt; : > "$PF"
    local i len
    for i in $(seq 0 9); do
        len=$(( 1 + (i * 53) % 150 ))
        printf 'The %d quick brown foxes jump over %d lazy dogs; batching must not change answers. ' "$i" "$((i * 7))" \
            | head -c "$len" | tr '\n' ' ' >> "$PF"; echo >> "$PF"
    done
    tac "$PF" > "$T/prompts.rev"
}

gen() { local m=$1; shift; "$BIN" generate -m "$m" --prompts-file "$PF" -n 8 --ignore-eos --json "$@" 2>"$T/gen.err"; }
unindex() { sed -E 's/^\{"index":[0-9]+,/{/' "$@"; }

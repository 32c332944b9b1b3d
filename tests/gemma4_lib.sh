# gemma4_lib.sh — sourced by t_gemma4.sh and t_gemma4_moe.sh (after BIN, T, ok and bad are set):
#   ref_python               sets PY to a python3 with numpy (empty when there is none)
#   reference_case M LEN S   generate 24 tokens on model dir $T/M after a LEN-token prompt (sampling
#                            flags S, may be empty), and check its logits against tests/gemma4_ref.py's
#                            float64 forward pass; the same rows one position off must fail
#   make_prompts             $PF: ten prompts of 1..150 bytes; $T/prompts.rev: the same, reversed
#   gen M FLAGS...           generate --json for every prompt of $PF on model M
#   unindex FILE...          --json lines without their "index" field (to compare reordered runs)
#   invariance M KV MODE     on model dir $T/M with KV type KV, greedy or seeded (MODE): the batchings,
#                            thread counts, prefill chunks, ISA and reversed order of $PF each equal the
#                            serialized scalar run (--batch 1 --threads 1 --isa scalar)
#   fault_breaks M FAULT "REF FLAGS" "VARIATION FLAGS" [reversed]
#                            the same comparison with FAULT injected in both runs must differ
#   badcfg 'PY EXPR ON c' 'EXPECTED TEXT'
#                            $T/m32 with its config.json edited by the expression: `info` must fail
#                            with exit 1 and one line containing the text

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

SAMPLING=(--temp 0.9 --top-k 50 --top-p 0.95 --seed 7)

invariance() {
    local m=$1 kv=$2 mode=$3 flags S
    S=(--kv-dtype "$kv"); [ "$mode" = seeded ] && S+=("${SAMPLING[@]}")
    gen "$T/$m" --batch 1 --threads 1 --isa scalar "${S[@]}" > "$T/ref" && [ "$(wc -l < "$T/ref")" = 10 ] \
        && ok || { bad "$m $kv $mode: reference run: $(cat "$T/gen.err")"; return; }
    for flags in "--batch 3" "--batch 10" "--batch 4 --threads 2" "--batch 3 --prefill-chunk 1" \
                 "--batch 3 --prefill-chunk 7" "--batch 5 --prefill-chunk whole --threads 2" "--isa auto --batch 6"; do
        # shellcheck disable=SC2086
        gen "$T/$m" $flags "${S[@]}" | cmp -s "$T/ref" - && ok || bad "$m $kv $mode: $flags differs from --batch 1"
    done
    "$BIN" generate -m "$T/$m" --prompts-file "$T/prompts.rev" -n 8 --ignore-eos --json --batch 8 "${S[@]}" \
        2>/dev/null | tac | unindex | cmp -s <(unindex "$T/ref") - && ok || bad "$m $kv $mode: reversed order differs"
}

fault_breaks() {
    local m=$1 f=$2 rf=$3 vf=$4
    # shellcheck disable=SC2086
    gen "$T/$m" --inject "$f" $rf > "$T/fref" || { bad "--inject $f: reference run failed: $(cat "$T/gen.err")"; return; }
    if [ "${5:-}" = reversed ]; then
        # shellcheck disable=SC2086
        "$BIN" generate -m "$T/$m" --prompts-file "$T/prompts.rev" -n 8 --ignore-eos --json --inject "$f" $vf \
            2>/dev/null | tac | unindex > "$T/fout"
        unindex "$T/fref" > "$T/fref2"; mv "$T/fref2" "$T/fref"
    else
        # shellcheck disable=SC2086
        gen "$T/$m" --inject "$f" $vf > "$T/fout"
    fi
    [ -s "$T/fout" ] && ! cmp -s "$T/fref" "$T/fout" && ok || bad "$m --inject $f: '$vf' still equals '$rf'"
}

badcfg() {   # badcfg 'PYTHON EXPRESSION ON c' 'EXPECTED TEXT'
    rm -rf "$T/bad"; cp -r "$T/m32" "$T/bad"
    if [ -n "$PY" ]; then
        "$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); $1; json.dump(c, open(sys.argv[1],'w'))" "$T/bad/config.json"
    else
        bad "no python3 to edit config.json"; return
    fi
    "$BIN" info -m "$T/bad" > "$T/bad.out" 2>&1; rc=$?
    [ $rc = 1 ] && [ "$(wc -l < "$T/bad.out")" = 1 ] && grep -qF "$2" "$T/bad.out" && ok \
        || bad "config ($1): exit $rc, '$(cat "$T/bad.out")' lacks '$2'"
}

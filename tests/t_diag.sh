#!/usr/bin/env bash
# Diagnostics end to end through the CLI: `isobatch probe` (the full default matrix clean, each fault
# flagged in its op only), `isobatch diff` (clean, and the first divergent layer and sub-op under each
# fault), `isobatch recall` (bitwise agreement on a synthetic model, lost under each batch fault; each
# case's own new-token limit near the end of the context; on the trained model models/default, when it
# exists, else SKIPPED with a notice: every batch fault changes answers, and the two RoPE faults open a
# batched/serialized recall gap; diff's verdicts there too),
# bad options, and short runs of all three under the ASan/UBSan build.
set -u
. "$(dirname "$0")/cli_bins.sh"
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_diag_XXXXXX)
trap 'rm -rf "$T"' EXIT

"$BIN" mkmodel --preset tiny --seed 5 --bits 4 --out "$T/m" >/dev/null || bad "mkmodel"
"$BIN" mkmodel --preset tiny --seed 5 --bits 32 --arch llama --out "$T/llama" >/dev/null || bad "mkmodel llama"

# ---- probe: the full default matrix (every op, B 1..33, T 1..64, positions 0..4095), clean
"$BIN" probe --verbose > "$T/probe" 2>&1; rc=$?
[ $rc = 0 ] && ok || bad "probe (full matrix) exit $rc: $(grep FAIL "$T/probe" | head -3)"
grep -qE '^[0-9]+ cases, 0 failed$' "$T/probe" && ok || bad "probe: no clean summary line"
grep -qE '^attention +any +\[33,4,64,64\] +4095 ' "$T/probe" && ok || bad "probe: largest attention case missing"
grep -qE '^matmul/q4-q8 +scalar +\[33,1,64,256\] ' "$T/probe" && ok || bad "probe: matmul/q4-q8 scalar case missing"
[ "$(grep -cE '^(embed|rmsnorm|qknorm|matmul|rope|attention|swiglu|sample)' "$T/probe")" -ge 1300 ] && ok || bad "probe: fewer cases than the matrix"

# by default only failing rows and the summary: a few dozen lines, not one per case
"$BIN" probe --op rope --batch-sizes 1,2,3 --tokens 1,2 > "$T/pq" 2>&1; rc=$?
[ $rc = 0 ] && grep -qE '^[0-9]+ cases, 0 failed$' "$T/pq" && ! grep -qE '^rope/.* ok$' "$T/pq" && [ "$(wc -l < "$T/pq")" -lt 40 ] \
    && ok || bad "probe default output is not a summary: $(wc -l < "$T/pq") lines"

# ---- probe under each batch fault: exit 1, failures only in the broken op's family
Q=(--batch-sizes 1,2,3 --tokens 1,2,7 --positions 0,148 --json)
for spec in "rope-scalar-offset:rope/" "rope-skip-rows:rope/" "gemv-gemm:matmul/" "split-kv-by-batch:attention" \
            "row-order:rmsnorm" "split-k-threads:(rmsnorm|qknorm)" "isa-fma:matmul/" "shared-rng:sample/seeded"; do
    f=${spec%%:*}; want=${spec#*:}
    "$BIN" probe "${Q[@]}" --threads 2 --inject "$f" > "$T/pj" 2>&1; rc=$?
    failing=$(grep -oE '\{"op":"[^"]*","cases":[0-9]+,"failed":[1-9][0-9]*\}' "$T/pj" | sed -E 's/.*"op":"([^"]*)".*/\1/')
    if [ "$f" = isa-fma ] && ! grep -q '"backends":\["scalar","avx2"' "$T/pj"; then
        echo "t_diag: isa-fma needs a vector backend: skipped"; continue
    fi
    [ $rc = 1 ] && ok || bad "probe --inject $f: exit $rc"
    [ -n "$failing" ] && ok || bad "probe --inject $f: nothing flagged"
    others=$(printf '%s\n' "$failing" | grep -vE "^$want" | tr '\n' ' ')
    [ -z "$others" ] && ok || bad "probe --inject $f: flagged other ops: $others"
done
"$BIN" probe --op rope --backend scalar --batch-sizes 1,2 --tokens 1 --positions 148 --inject rope-skip-rows > "$T/pt" 2>&1
grep -qE '^rope/halves/scalar-pos +any +\[2,4,1,128\] +148 .*FAIL\(rows,B=1\)' "$T/pt" && ok || bad "probe table row for the MLX bug"
grep -q 'rope/halves/scalar-pos .* at B in {2}, T in {1}, pos in {148}' "$T/pt" && ok || bad "probe summary for the MLX bug"

# ---- probe: bad options
expect_usage() { # name, pattern, command...
    local name=$1 pat=$2; shift 2
    "$@" > "$T/err" 2>&1; local rc=$?
    [ $rc = 2 ] && grep -q -- "$pat" "$T/err" && ok || bad "$name: exit $rc, $(head -c 200 "$T/err")"
}
expect_usage "probe unknown op" "no op or family 'nope'" "$BIN" probe --op nope
expect_usage "probe bad backend" "--backend: unknown 'gpu'" "$BIN" probe --backend gpu
expect_usage "probe bad list" "--tokens: bad list" "$BIN" probe --tokens 1,x
expect_usage "probe unknown fault" "--inject: unknown fault" "$BIN" probe --inject nope
if ! grep -q avx512f /proc/cpuinfo; then
    expect_usage "probe avx512 on this CPU" "not supported by this CPU" "$BIN" probe --backend avx512
fi
"$BIN" probe --op list | grep -q '^attention/window' && ok || bad "probe --op list"

# ---- diff: clean, then each fault's first divergent layer and sub-op
"$BIN" diff -m "$T/m" > "$T/d" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^no divergence" "$T/d" && ok || bad "diff clean: exit $rc"
DIFF_FAULTS=("rope-scalar-offset:step 1, layer 0, point q: sub-op rope"
             "rope-skip-rows:step 1, layer 0, point q: sub-op rope"
             "gemv-gemm:point logits: sub-op matmul"
             "split-kv-by-batch:step 0, layer 0, point attn_out: sub-op attention"
             "row-order:layer 0, point attn_norm: sub-op rmsnorm")
for spec in "${DIFF_FAULTS[@]}"; do
    f=${spec%%:*}; want=${spec#*:}
    "$BIN" diff -m "$T/m" --inject "$f" > "$T/d" 2>&1; rc=$?
    [ $rc = 1 ] && grep -q "^first divergence: .*$want" "$T/d" && ok || bad "diff --inject $f: exit $rc, $(grep '^first' "$T/d")"
done
"$BIN" diff -m "$T/m" --inject gemv-gemm --step 1 > "$T/d" 2>&1
grep -q "^step 1 (decode): first divergence at layer 0, q_proj (matmul)" "$T/d" && ok || bad "diff gemv-gemm at decode"
"$BIN" diff -m "$T/llama" --inject rope-skip-rows --json > "$T/dj" 2>&1
grep -q '"first_divergence":{"step":1,"layer":0,"point":"q","op":"rope"}' "$T/dj" && ok || bad "diff --json on llama"
"$BIN" diff -m "$T/m" -p "one prompt that is long enough to span an attention block" -p "and another, shorter" --batch 1 > /dev/null 2>&1 \
    && ok || bad "diff --batch 1 is the alone run and must match"
expect_usage "diff bad step" "--step: bad value" "$BIN" diff -m "$T/m" --step -1

# ---- recall on the synthetic model: outputs bitwise equal clean, not under a fault
"$BIN" recall -m "$T/m" --sessions 4 --length 256 > "$T/r" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^bitwise: 4 of 4 sessions identical" "$T/r" && ok || bad "recall clean: exit $rc"
grep -qE '^serialized +recall [0-9]+/4 = .* tok/s$' "$T/r" && grep -qE '^batched +recall [0-9]+/4 = .* tok/s$' "$T/r" \
    && ok || bad "recall: per-mode recall and tok/s lines"
for f in rope-scalar-offset rope-skip-rows gemv-gemm split-kv-by-batch row-order; do
    "$BIN" recall -m "$T/m" --sessions 4 --length 256 --inject "$f" > "$T/r" 2>&1; rc=$?
    [ $rc = 1 ] && grep -q "batching changed answers" "$T/r" && ok || bad "recall --inject $f: exit $rc"
done
# progress (by default on a terminal; --progress here): cases done and the running recall per mode
"$BIN" recall -m "$T/m" --sessions 3 --length 256 --progress > /dev/null 2> "$T/rp"
tr '\r' '\n' < "$T/rp" | grep -qE '^recall: serialized +3/3 cases done, running recall [0-9]/3$' \
    && tr '\r' '\n' < "$T/rp" | grep -qE '^recall: batched +1/3 cases done' && ok || bad "recall --progress: $(tr '\r' '|' < "$T/rp")"
"$BIN" recall -m "$T/m" --sessions 2 --length 256 --json > "$T/rj" 2>&1
grep -q '"bitwise_match":true' "$T/rj" && grep -q '"code":"[A-Z]*-[0-9][0-9][0-9][0-9]"' "$T/rj" && ok || bad "recall --json"
# each case's new-token limit is its own: the answer budget, or what its prompt leaves in the
# 2048-token context (2049 - prompt tokens), whichever is less. Documents of up to 2056 tokens make
# some prompts leave less than the budget and others not (here one case of the six gets 10 of 15).
"$BIN" recall -m "$T/m" --sessions 6 --length 2056 --batch 4 --json > "$T/rl" 2>&1; rc=$?
lims=$(grep -oE '"prompt_tokens":[0-9]+,"max_new_tokens":[0-9]+' "$T/rl" | sed -E 's/.*:([0-9]+),.*:([0-9]+)/\1 \2/')
budget=$(printf '%s\n' "$lims" | awk '$2 > m { m = $2 } END { print m + 0 }')
wrong=$(printf '%s\n' "$lims" | awk -v b="$budget" '{ r = 2049 - $1; w = r < b ? r : b; if ($2 != w) print }')
kinds=$(printf '%s\n' "$lims" | awk '{ print $2 }' | sort -u | wc -l)
[ $rc = 0 ] && grep -q '"bitwise_match":true' "$T/rl" && [ "$(printf '%s\n' "$lims" | grep -c .)" = 6 ] && [ -z "$wrong" ] \
    && [ "$kinds" -ge 2 ] && ok || bad "recall per-case new-token limits (exit $rc, budget $budget, wrong: ${wrong:-none}, $kinds distinct)"
expect_usage "recall bad sessions" "--sessions: bad value" "$BIN" recall -m "$T/m" --sessions 0
"$BIN" recall -m "$T/m" --sessions 1 --length 20 > "$T/err" 2>&1
[ $? = 1 ] && grep -q "below the empty document" "$T/err" && ok || bad "recall length below the empty document"
"$BIN" recall -m "$T/m" --spec /nonexistent.json > "$T/err" 2>&1
[ $? = 1 ] && grep -q "/nonexistent.json: cannot open" "$T/err" && ok || bad "recall missing spec"

# ---- diff and the recall gap on the trained default model
# Held-out recall (the benchmark) is reported and must agree bitwise between modes. The gap under a
# fault needs a model that retrieves; it is shown with --words train, the code words a model learns to
# retrieve first (the bundled model retrieves held-out and training words alike, see docs/training.md).
if [ -f models/default/config.json ]; then
    # diff on the trained model: clean, and the same verdict as on the synthetic one for every fault
    "$BIN" diff -m models/default > "$T/d" 2>&1; rc=$?
    [ $rc = 0 ] && grep -q "^no divergence" "$T/d" && ok || bad "diff on models/default clean: exit $rc"
    for spec in "${DIFF_FAULTS[@]}"; do
        f=${spec%%:*}; want=${spec#*:}
        "$BIN" diff -m models/default --inject "$f" > "$T/d" 2>&1; rc=$?
        [ $rc = 1 ] && grep -q "^first divergence: .*$want" "$T/d" && ok || bad "diff on models/default --inject $f: exit $rc, $(grep '^first' "$T/d")"
    done
    num() { grep -oE "\"$1\":\{\"recalled\":[0-9]+" "$2" | grep -oE '[0-9]+$'; }
    "$BIN" recall -m models/default --sessions 8 --length 512 --json > "$T/rd" 2>&1; rc=$?
    [ $rc = 0 ] && grep -q '"bitwise_match":true' "$T/rd" && ok || bad "recall on models/default: batched differs from serialized (exit $rc)"
    h=$(num serialized "$T/rd"); hb=$(num batched "$T/rd")
    [ -n "$h" ] && [ "$h" = "$hb" ] && ok || bad "recall on models/default: serialized ${h:-?} vs batched ${hb:-?} clean"
    "$BIN" recall -m models/default --sessions 8 --length 512 --words train --json > "$T/rt" 2>&1; rc=$?
    s=$(num serialized "$T/rt"); b=$(num batched "$T/rt")
    [ $rc = 0 ] && [ -n "$s" ] && [ "$s" = "$b" ] && ok || bad "recall --words train on models/default: clean modes differ (${s:-?} vs ${b:-?}, exit $rc)"
    [ -n "$s" ] && [ "$s" -ge 6 ] && ok || bad "recall --words train on models/default: the model recalls ${s:-?}/8: no gap can show"
    # every batch fault changes answers (exit 1, not bitwise); the RoPE faults, which misplace rows,
    # also cost recall in the batched mode only (the others reorder float sums: answers change, recall
    # need not)
    gaps=""
    for f in rope-scalar-offset rope-skip-rows gemv-gemm split-kv-by-batch row-order; do
        "$BIN" recall -m models/default --sessions 8 --length 512 --words train --json --inject $f > "$T/rf" 2>&1; rc=$?
        s2=$(num serialized "$T/rf"); b2=$(num batched "$T/rf")
        [ $rc = 1 ] && grep -q '"bitwise_match":false' "$T/rf" && ok || bad "recall on models/default under $f: exit $rc, no bitwise difference"
        case $f in rope-*|split-kv-by-batch)   # faults that leave a lone session's run unchanged
            [ -n "$s2" ] && [ "$s2" = "$s" ] && ok || bad "recall on models/default under $f: serialized recall ${s2:-?}/8, clean $s/8" ;;
        esac
        case $f in rope-*)
            [ -n "$b2" ] && [ -n "$s2" ] && [ "$b2" -lt "$s2" ] && ok \
                || bad "recall on models/default under $f: no gap (serialized ${s2:-?}, batched ${b2:-?})" ;;
        esac
        gaps="$gaps; $f serialized ${s2:-?}/8, batched ${b2:-?}/8"
    done
    echo "t_diag: models/default recall 8 x 512: held-out ${h:-?}/8 both modes; training words ${s:-?}/8 both modes$gaps"
else
    echo "t_diag: SKIPPED the recall-gap test on the trained model: models/default/config.json is missing"
fi

# ---- short runs under AddressSanitizer / UBSan
if [ -x "$ASAN_BIN" ]; then
    for cmd in "probe --op rope --batch-sizes 1,3 --tokens 1,2 --positions 0,148" \
               "probe --op attention --batch-sizes 2 --tokens 7 --positions 148 --inject split-kv-by-batch" \
               "probe --op sample --batch-sizes 2 --tokens 2 --positions 1 --json" \
               "probe --op matmul --batch-sizes 1,2 --tokens 1 --json --inject gemv-gemm" \
               "diff -m $T/m --inject row-order --json" "diff -m $T/llama --step 2" \
               "recall -m $T/m --sessions 2 --length 128" "recall -m $T/m --sessions 2 --length 20" \
               "recall -m $T/m --first-case 3 --sessions 3 --length 2056 --batch 2"; do
        # shellcheck disable=SC2086
        "$ASAN_BIN" $cmd > "$T/a" 2>&1
        grep -qE "AddressSanitizer|LeakSanitizer|runtime error" "$T/a" && bad "sanitizers: isobatch $cmd: $(grep -m1 -E 'Sanitizer|runtime error' "$T/a")" || ok
    done
else
    bad "$ASAN_BIN missing (run make asan)"
fi

echo "t_diag: $pass passed, $fail failed"
[ $fail = 0 ]

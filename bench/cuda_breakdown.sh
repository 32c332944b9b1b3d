#!/usr/bin/env bash
# cuda_breakdown.sh BIN MODEL_DIR ROUNDS -- BENCH_ARGS...
# Where a CUDA decode step's time goes inside its graph. `IB_CUDA_REPEAT` launches one kind of kernel
# twice in every step (attn: attention; linear: the products; norm: the row norms; act: SwiGLU; empty: a
# kernel that only waits for its predecessor, after each product; moe, for a mixture-of-experts model:
# the experts' products), so what the step grows by is that
# kind's cost inside the graph, its boundaries included (docs/cuda.md, "Inside the graph at B=1").
# Runs bench/ab_bench.sh over those settings and the plain one (alternated, ROUNDS times), then prints
# per batch size the step's milliseconds (batch / median tok/s) and what each repeated kind adds. E.g.
#   bench/cuda_breakdown.sh build/isobatch /tmp/q8b 2 -- --backend cuda --batch 1,8 --prompt 128 --gen 32
#       --reps 3 --kv-dtype f16
set -u
usage() { echo "usage: cuda_breakdown.sh BIN MODEL_DIR ROUNDS -- BENCH_ARGS..." >&2; exit 2; }
[ $# -ge 4 ] && [ "$4" = -- ] || usage
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 model=$2 rounds=$3
shift 4
# a mixture-of-experts model (config.json's enable_moe_block) also gets moe: the experts' products twice
kinds="attn linear norm act empty"
grep -q '"enable_moe_block": *true' "$model/config.json" 2>/dev/null && kinds="$kinds moe"
settings=()
for k in $kinds; do settings+=("IB_CUDA_REPEAT=$k"); done
out=$(bash "$here/ab_bench.sh" "$bin" "$model" "$rounds" "" "${settings[@]}" -- "$@") || exit $?
printf '%s\n' "$out"
printf '%s\n' "$out" | awk -v kinds="$kinds" '
    $2 ~ /^B=/ {
        b = substr($2, 3); med = $NF; sub(/\)$/, "", med)
        k = $1 == "(none)" ? "base" : substr($1, index($1, "=") + 1)
        if (med + 0 <= 0) { bad = 1; next }
        ms[b, k] = b * 1000.0 / med
        if (!(b in seen)) { seen[b] = 1; order[++n] = b }
    }
    END {
        if (bad || n == 0) { print "cuda_breakdown.sh: no decode figures to break down" > "/dev/stderr"; exit 1 }
        nk = split(kinds, ks, " ")
        printf "\n%-6s %9s %11s %10s %10s %9s %14s", "batch", "step ms", "+attention", "+products", "+row norms",
               "+SwiGLU", "+empty kernels"
        if (nk > 5) printf " %9s", "+experts"
        printf "\n"
        w[1] = 11; w[2] = 10; w[3] = 10; w[4] = 9; w[5] = 14; w[6] = 9
        for (i = 1; i <= n; i++) {
            b = order[i]
            printf "%-6s %9.3f", b, ms[b, "base"]
            for (j = 1; j <= nk; j++) printf(" %+" w[j] ".3f", ms[b, ks[j]] - ms[b, "base"])
            printf "\n"
        }
    }'

#!/usr/bin/env bash
# cpu_vs_llama.sh ISOBATCH MODEL_DIR PEER_DIR [THREADS] [ROUNDS] — isobatch against llama.cpp in one run
# on this CPU (prints numbers, judges nothing). MODEL_DIR: a qwen3-0.6b-shaped model (`isobatch mkmodel
# --preset qwen3-0.6b --bits 4 --out DIR`); PEER_DIR: a llama.cpp build and its Q4_0 model of the same
# shapes as ../shared/peer/README.md makes them (PEER_DIR/build/bin/llama-bench, llama-batched-bench,
# PEER_DIR/q4_0.gguf). Each round: isobatch with f16 then q8 KV (`bench --batch 1,16,64 --prompt 128
# --gen 32 --reps 3`, and `--batch 1 --prompt 512`), then llama.cpp (`llama-bench -p 512 -n 128`,
# `llama-batched-bench -npp 128 -ntg 32 -npl 1,16` with its default f16 KV, and at 16 with its q8_0 KV
# and flash attention); at the end, a line a round of isobatch's figures over llama.cpp's (B=1 against
# tg128, B=16 against S_TG at 16, prefill 512 against pp512). About 6 minutes a round on 2 cores.
set -u
[ $# -ge 3 ] || { echo "usage: $0 ISOBATCH MODEL_DIR PEER_DIR [THREADS] [ROUNDS]" >&2; exit 2; }
ib=$1 model=$2 peer=$3 threads=${4:-2} rounds=${5:-2}
for f in "$ib" "$peer/build/bin/llama-bench" "$peer/build/bin/llama-batched-bench"; do
    [ -x "$f" ] || { echo "$0: $f is not an executable" >&2; exit 2; }
done
[ -f "$peer/q4_0.gguf" ] || { echo "$0: $peer/q4_0.gguf missing" >&2; exit 2; }
[ -f "$model/config.json" ] || { echo "$0: $model is not a model directory" >&2; exit 2; }
log=$(mktemp) || exit 1
trap 'rm -f "$log"' EXIT
for round in $(seq 1 "$rounds"); do
    for kv in f16 q8; do
        echo "== isobatch round $round, $kv KV"
        "$ib" bench -m "$model" --batch 1,16,64 --prompt 128 --gen 32 --reps 3 --threads "$threads" --kv-dtype $kv 2>&1 |
            grep -E "^prefill|^ +(1|16|64) "
        "$ib" bench -m "$model" --batch 1 --prompt 512 --gen 8 --reps 2 --threads "$threads" --kv-dtype $kv 2>&1 |
            grep -E "^prefill"
    done
    echo "== llama.cpp round $round"
    "$peer/build/bin/llama-bench" -m "$peer/q4_0.gguf" -p 512 -n 128 -t "$threads" 2>&1 | grep -E "pp512|tg128"
    "$peer/build/bin/llama-batched-bench" -m "$peer/q4_0.gguf" -c 4096 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 1,16 \
        -t "$threads" 2>&1 | grep -E "^\|\s+[0-9]" | sed 's/^/f16 KV: /'
    "$peer/build/bin/llama-batched-bench" -m "$peer/q4_0.gguf" -c 4096 -b 2048 -ub 512 -npp 128 -ntg 32 -npl 16 \
        -t "$threads" -ctk q8_0 -ctv q8_0 -fa 2>&1 | grep -E "^\|\s+[0-9]" | sed 's/^/q8_0 KV, flash attention: /'
done | tee "$log"
# The ratios of each round, from the lines above (a figure that did not come out leaves its ratio "-").
awk '
function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.1fx", a / b) : "-" }
function report() {
    if (round == "") return
    printf "== ratios, round %s (isobatch / llama.cpp): decode B=1 f16 KV %s, q8 KV %s (against tg128); B=16 f16 KV %s, q8 KV %s (against S_TG at 16), q8 KV %s against its q8_0 KV + flash attention; prefill 512 f16 KV %s (against pp512)\n",
        round, ratio(ib["f16", 1], tg), ratio(ib["q8", 1], tg), ratio(ib["f16", 16], stg), ratio(ib["q8", 16], stg),
        ratio(ib["q8", 16], stgq), ratio(pp["f16"], pp512)
    delete ib; delete pp; tg = stg = stgq = pp512 = ""
}
/^== isobatch round/ { r = $4; sub(/,$/, "", r); if (r != round) { report(); round = r } kv = $5; next }
/^== llama.cpp round/ { kv = "llama"; next }
kv != "llama" && /^prefill 512 tokens:/ { pp[kv] = $4; next }
kv != "llama" && /^ +[0-9]+ +[0-9.]+ / { ib[kv, $1 + 0] = $2; next }
/ pp512 / { n = split($0, f, "|"); pp512 = f[n - 1] + 0; next }
/ tg128 / { n = split($0, f, "|"); tg = f[n - 1] + 0; next }
/^f16 KV:/ { split($0, f, "|"); if (f[4] + 0 == 16) stg = f[9] + 0; next }
/^q8_0 KV, flash attention:/ { split($0, f, "|"); if (f[4] + 0 == 16) stgq = f[9] + 0; next }
END { report() }' "$log"

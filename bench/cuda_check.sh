#!/usr/bin/env bash
# cuda_check.sh BIN_DIR [OUT_DIR] — the CUDA backend's whole check-and-bench set, for one call on a
# machine with a GPU (built elsewhere: BIN_DIR holds isobatch, test_backend_cuda, test_backend_ops,
# and lib/ with the shared libraries the device lacks). Writes one log per part into OUT_DIR and a
# summary table last.
#   1. test_backend_cuda: every op of the CUDA table bitwise vs the scalar references (3 weight
#      formats x act f32/q8 x KV f32/f16 x full/sink+window; dp4a and tensor-core products), batched ==
#      alone, CPU engine == CUDA engine on whole steps, each shown to fail under gpu-fma.
#   2. test_backend_ops: the backend op checker (diag/backend_check.c) on the CPU ISAs and on CUDA.
#   3. generate digests, CPU vs CUDA, on models/default: act q8/f32 x KV f32/f16/q8 x greedy/sampled x
#      three schedules (batch 1; batch 8 chunks of 5; batch 4 whole prompts), and with a sink 4 + window
#      12 KV policy (two schedules); --check-serial on CUDA;
#      gpu-fma must change the CUDA digests.
#   3b. the same on gemma4-tiny and gemma4-moe-tiny (4-bit), --check-serial and gpu-fma on each.
#   3c. the MoE faults on the GPU (gemma4-moe-tiny, top-k 3): under moe-capacity and moe-combine-by-load
#       the CUDA digests equal the CPU's under the same fault (the GPU models the CPU's fault exactly),
#       --check-serial on CUDA must fail, and probe --backend cuda must fail at its moe op.
#   4. recall --backend cuda vs cpu (answers batched and serialized).
#   5. speed: test_backend_cuda --bench (qwen3-0.6b-shaped 4-bit: prefill, decode B=1 and B=128) and
#      isobatch bench --backend cuda.
#   7. isobatch bench --backend cuda --batch 1,8 on gemma4-26b-a4b 4-bit (mkmodel writes 14.2 GB to
#      /tmp first; CUDA_CHECK_G26=0 skips it).
set -u
bin=${1:?usage: cuda_check.sh BIN_DIR [OUT_DIR]}
out=${2:-${OUT:-/tmp/cuda_check}}
mkdir -p "$out"
export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sum="$out/summary.txt"
: >"$sum"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
echo "gpu: $(cat "$out/gpu.txt")" >>"$sum"

"$bin/test_backend_cuda" >"$out/test_backend_cuda.log" 2>&1
echo "test_backend_cuda (rc $?): $(tail -1 "$out/test_backend_cuda.log")" >>"$sum"
"$bin/test_backend_ops" >"$out/test_backend_ops.log" 2>&1
echo "test_backend_ops (rc $?): $(grep -i cuda "$out/test_backend_ops.log" | tail -1); $(tail -1 "$out/test_backend_ops.log")" >>"$sum"

prompts=examples/prompts.txt
# one generate configuration on both backends: EQUAL or DIFF, then its arguments
cmp_digests() {
    local a b
    a=$("$bin/isobatch" generate "$@" --backend cpu 2>&1 | grep -o '"digest": *"[0-9a-f]*"' | tr '\n' ' ')
    b=$("$bin/isobatch" generate "$@" --backend cuda 2>&1 | grep -o '"digest": *"[0-9a-f]*"' | tr '\n' ' ')
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "EQUAL  $*"; else echo "DIFF  $*"; fi
}
# the digest matrix of model $1 (name $2) into the summary: act q8/f32 x KV f32/f16/q8 x greedy/sampled x
# three schedules, and with $3 (a KV policy, "" for none) two schedules more; then --check-serial, and
# gpu-fma must change the CUDA digests
check_model() {
    local model=$1 name=$2 policy=$3 log="$out/digests_$2.log" act kv samp sched a b r
    {
        for act in q8 f32; do
            for kv in f32 f16 q8; do
                for samp in "" "--temp 0.8 --top-p 0.9 --seed 7"; do
                    for sched in "--batch 1" "--batch 8 --prefill-chunk 5" "--batch 4 --prefill-chunk whole"; do
                        cmp_digests -m "$model" --prompts-file $prompts -n 24 --json --act $act --kv-dtype $kv $samp $sched
                    done
                    [ -z "$policy" ] && continue
                    for sched in "--batch 1" "--batch 8 --prefill-chunk 5"; do
                        cmp_digests -m "$model" --prompts-file $prompts -n 24 --json --act $act --kv-dtype $kv \
                            --kv "$policy" $samp $sched
                    done
                done
            done
        done
    } >"$log" 2>&1
    echo "$name generate digests CPU vs CUDA: $(grep -c '^EQUAL' "$log") of $(grep -c '' "$log") configurations equal" \
        "(8 prompts x 24 tokens each; $(grep -c -- '--kv ' "$log") of them with --kv $policy)" >>"$sum"
    "$bin/isobatch" generate -m "$model" --prompts-file $prompts -n 24 --batch 8 --prefill-chunk 3 --backend cuda \
        --check-serial >"$out/check_serial_$name.log" 2>&1
    echo "$name generate --backend cuda --check-serial (rc $?): $(grep -i 'serial' "$out/check_serial_$name.log" | tail -1)" >>"$sum"
    a=$("$bin/isobatch" generate -m "$model" --prompts-file $prompts -n 24 --json --backend cpu 2>&1 | grep -o '"digest": *"[0-9a-f]*"' | tr '\n' ' ')
    b=$("$bin/isobatch" generate -m "$model" --prompts-file $prompts -n 24 --json --backend cuda --inject gpu-fma 2>&1 | grep -o '"digest": *"[0-9a-f]*"' | tr '\n' ' ')
    [ -n "$b" ] && [ "$a" != "$b" ] && r="digests differ (caught)" || r="NOT caught"
    echo "$name generate --backend cuda --inject gpu-fma vs cpu: $r" >>"$sum"
}
# models/default, with windowed sessions too (sink 4 + window 12: keys evicted, rings wrapped)
model=models/default
check_model $model default "sink:4,window:12"
# Gemma 4 (gemma_kernels.cuh) on the dense and MoE tiny presets (4-bit): 24 tokens past prompts of
# several tokens go past the sliding window of 16
for preset in gemma4-tiny gemma4-moe-tiny; do
    gm=/tmp/cuda_check_$preset
    rm -rf "$gm"
    "$bin/isobatch" mkmodel --preset $preset --bits 4 --out "$gm" >"$out/mkmodel_$preset.log" 2>&1
    check_model "$gm" $preset ""
done
# the MoE faults (top-k 3: with two outputs the combine's order cannot change a bit)
k3=/tmp/cuda_check_moe_k3
rm -rf "$k3"
"$bin/isobatch" mkmodel --preset gemma4-moe-tiny --bits 4 --seed 5 --top-k 3 --out "$k3" >"$out/mkmodel_k3.log" 2>&1
for f in moe-capacity moe-combine-by-load; do
    eq=$(cmp_digests -m "$k3" --prompts-file $prompts -n 24 --json --batch 8 --prefill-chunk 5 --inject $f | cut -d' ' -f1)
    "$bin/isobatch" generate -m "$k3" --prompts-file $prompts -n 24 --batch 8 --backend cuda --check-serial --inject $f \
        >"$out/check_serial_k3_$f.log" 2>&1
    rc=$?
    [ $rc = 1 ] && grep -q "differs from its serialized run" "$out/check_serial_k3_$f.log" && cs="caught" || cs="NOT caught (rc $rc)"
    "$bin/isobatch" probe -m "$k3" --backend cuda --inject $f >"$out/probe_k3_$f.log" 2>&1
    rc=$?
    [ $rc = 1 ] && grep -qE "^ +cuda .* moe .*DIFFER" "$out/probe_k3_$f.log" && pr="fails at moe (caught)" || pr="NOT caught (rc $rc)"
    echo "gemma4-moe-tiny k3 --inject $f: CUDA vs CPU digests (batch 8) $eq; --check-serial on CUDA $cs; probe --backend cuda $pr" >>"$sum"
done
"$bin/isobatch" probe -m "$k3" --backend cuda >"$out/probe_k3.log" 2>&1
echo "gemma4-moe-tiny k3 probe --backend cuda (rc $?): $(tail -1 "$out/probe_k3.log")" >>"$sum"

# recall (the multi-tenant needle benchmark): the CUDA engine's answers, batched and serialized, are the
# CPU engine's
for be in cpu cuda; do
    "$bin/isobatch" recall -m $model --sessions 8 --length 512 --json --backend $be >"$out/recall_$be.json" 2>"$out/recall_$be.err"
done
python3 - "$out/recall_cpu.json" "$out/recall_cuda.json" >>"$sum" <<'EOF3'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
ca = [(c['serialized'], c['batched']) for c in a['cases']]
cb = [(c['serialized'], c['batched']) for c in b['cases']]
print('recall 8 x 512: cpu recall %.3f (batched == serialized bitwise: %s); cuda recall %.3f (%s); cuda answers == cpu answers: %s'
      % (a['batched']['recall'], a['bitwise_match'], b['batched']['recall'], b['bitwise_match'], ca == cb))
EOF3

"$bin/test_backend_cuda" --bench >"$out/bench_cuda.log" 2>&1
echo "--- test_backend_cuda --bench (rc $?)" >>"$sum"
grep -E "prefill|decode|bitwise|every op" "$out/bench_cuda.log" >>"$sum"
"$bin/isobatch" mkmodel --preset qwen3-0.6b --bits 4 --out /tmp/q06 >/dev/null 2>&1
"$bin/isobatch" bench -m /tmp/q06 --backend cuda --batch 1,16,64,128 --prompt 128 --gen 32 --reps 3 >"$out/isobatch_bench.log" 2>&1
echo "--- isobatch bench --backend cuda (rc $?)" >>"$sum"
cat "$out/isobatch_bench.log" >>"$sum"
# 7. Gemma-4-26B-A4B's shapes, random 4-bit weights (14.2 GB file; mkmodel took ~5 min on a 2-core VM,
# loading ~2.5 min there): decode B=1 and B=8 on the CUDA backend. CUDA_CHECK_G26=0 skips it.
if [ "${CUDA_CHECK_G26:-1}" != 0 ]; then
    g26=/tmp/cuda_check_g26
    [ -f "$g26/config.json" ] || "$bin/isobatch" mkmodel --preset gemma4-26b-a4b --out "$g26" >"$out/mkmodel_g26.log" 2>&1
    echo "--- gemma4-26b-a4b 4-bit: $(du -sh "$g26" 2>/dev/null | cut -f1) on disk" >>"$sum"
    "$bin/isobatch" bench -m "$g26" --backend cuda --batch 1,8 --prompt 32 --gen 16 --reps 3 >"$out/bench_g26.log" 2>&1
    echo "--- isobatch bench gemma4-26b-a4b --backend cuda (rc $?)" >>"$sum"
    cat "$out/bench_g26.log" >>"$sum"
fi
# 6. where a decode step's GPU time goes: ncu, one step at B = 1 and one at B = 128 (kernel durations)
if command -v ncu >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/ncu ]; then
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    "$ncu" --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
        "$bin/test_backend_cuda" --profile decode >"$out/ncu.csv" 2>"$out/ncu.err"
    python3 - "$out/ncu.csv" >>"$sum" <<'EOF2'
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = [i for i, r in enumerate(rows) if 'Kernel Name' in r][0]
h = rows[hdr]; ki = h.index('Kernel Name'); vi = h.index('Metric Value')
data = [(r[ki], float(r[vi].replace(',', ''))) for r in rows[hdr + 1:] if len(r) > vi]
n = len(data)
# the B=1 step ends with its logits: the gather of the wanted rows, then (after the final norm and the
# quantization) the lm_head product; the B=128 step is everything after that product
g = next(i for i, (k, v) in enumerate(data) if k.startswith('gather_kernel'))
cut = next(i for i in range(g, n) if 'mm_q8' in data[i][0]) + 1
for part, (a, b) in (('B=1', (0, cut)), ('B=128', (cut, n))):
    agg = collections.defaultdict(lambda: [0, 0.0])
    for k, v in data[a:b]:
        kk = k.split('(')[0][:36]; agg[kk][0] += 1; agg[kk][1] += v
    print('--- ncu, one decode step at %s: %d kernels, %.0f us of kernel time' % (part, b - a, sum(v[1] for v in agg.values()) / 1e3))
    for k, v in sorted(agg.items(), key=lambda x: -x[1][1]):
        print('  %-36s %4d  %8.1f us' % (k, v[0], v[1] / 1e3))
EOF2
fi
cat "$sum"

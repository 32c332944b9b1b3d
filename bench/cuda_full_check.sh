#!/usr/bin/env bash
# cuda_full_check.sh BIN_DIR [OUT_DIR] — everything the CUDA backend is checked and measured with, for
# one call on a GPU machine (binaries built elsewhere; BIN_DIR as for cuda_check.sh): bench/cuda_check.sh,
# then `probe --backend cuda` clean and under gpu-split-k and gpu-att-block, bench/serve_check.sh clean and
# under gpu-fma and share-early, bench/cuda_kv_budget_check.sh (the server's KV budget from the GPU's memory),
# and what the contract's order costs (isobatch bench with and without --inject gpu-split-k; left out
# with CUDA_CHECK_COST=0). Writes OUT_DIR/summary.txt (among about 130 logs under OUT_DIR) and prints it.
set -u
bin=${1:?usage: cuda_full_check.sh BIN_DIR [OUT_DIR]}
out=${2:-${OUT:-/tmp/cuda_full_check}}
mkdir -p "$out/check"
export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
timeout 420 bash bench/cuda_check.sh "$bin" "$out/check" >/dev/null 2>&1
rc=$?
S=$out/summary.txt
cp "$out/check/summary.txt" "$S"
echo "cuda_check rc $rc in $(($(date +%s) - t0)) s" >>"$S"
echo "probe --backend cuda: $(timeout 60 "$bin/isobatch" probe --backend cuda 2>&1 | tail -1)" >>"$S"
echo "probe --backend cuda --inject gpu-split-k: $(timeout 60 "$bin/isobatch" probe --backend cuda --inject gpu-split-k 2>&1 | tail -1)" >>"$S"
echo "probe --backend cuda --inject gpu-att-block: $(timeout 60 "$bin/isobatch" probe --backend cuda --inject gpu-att-block 2>&1 | tail -1)" >>"$S"
echo "serve_check: $(timeout 100 bash bench/serve_check.sh "$bin/isobatch" cuda "$out/serve" 2>&1 | tail -1)" >>"$S"
echo "serve_check under gpu-fma: $(SERVE_ARGS='--inject gpu-fma' timeout 100 bash bench/serve_check.sh "$bin/isobatch" cuda "$out/servefault" 2>&1 | tail -1)" >>"$S"
echo "serve_check under share-early: $(SERVE_ARGS='--inject share-early' timeout 100 bash bench/serve_check.sh "$bin/isobatch" cuda "$out/serveshare" 2>&1 | tail -1)" >>"$S"
echo "$(timeout 120 bash bench/cuda_kv_budget_check.sh "$bin/isobatch" /tmp/q06 "$out/kvbudget" 2>&1 | tail -1)" >>"$S"
# CUDA_CHECK_COST=0 leaves out what the order costs (two more benches, about three minutes)
[ "${CUDA_CHECK_COST:-1}" = 0 ] || for f in none gpu-split-k; do
    echo "--- what the order costs: isobatch bench (qwen3-0.6b 4-bit) --backend cuda, fault $f" >>"$S"
    timeout 90 "$bin/isobatch" bench -m /tmp/q06 --backend cuda --batch 1,16,128 --prompt 128 --gen 32 --reps 3 \
        $([ $f = none ] || echo --inject $f) 2>&1 | grep -E '^ +[0-9]+ |prefill|fault' >>"$S"
done
echo "total $(($(date +%s) - t0)) s" >>"$S"
cat "$S"

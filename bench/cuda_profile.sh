#!/usr/bin/env bash
# cuda_profile.sh BIN_DIR STEP [OUT_CSV [MODEL_DIR]] — where one CUDA step's kernel time goes, kernel by kernel (ncu,
# each kernel alone with cold caches: upper bounds of what it takes inside a graph).
# STEP: b1 (a decode step at B=1), b128 (a decode step at B=128, 129 keys a row) or prefill (one
# 128-token prompt), of test_backend_cuda --profile's qwen3-0.6b-shaped 4-bit model (f16 KV, act q8;
# MODEL_DIR: such a model made once, `isobatch mkmodel --preset qwen3-0.6b --seed 1 --bits 4 --group 64`,
# else the test makes its own).
# Prints per kernel name: launches, total and mean microseconds, share of the step, grid, registers a
# thread, and the mean of SM and DRAM throughput (% of peak) and achieved occupancy, largest total first.
set -u
bin=${1:?usage: cuda_profile.sh BIN_DIR b1|b128|prefill [OUT_CSV]}
step=${2:?usage: cuda_profile.sh BIN_DIR b1|b128|prefill [OUT_CSV]}
csv=${3:-/tmp/cuda_profile_$step.csv}
model=${4:-}
export LD_LIBRARY_PATH="$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
metrics=gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread
metrics=$metrics,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics=$metrics,sm__warps_active.avg.pct_of_peak_sustained_active
[ "${CUDA_PROFILE_REUSE:-0}" = 1 ] && [ -s "$csv" ] ||   # CUDA_PROFILE_REUSE=1: summarize OUT_CSV again
ncu --profile-from-start off --csv --print-units base --metrics "$metrics" "$bin/test_backend_cuda" --profile "$step" $model >"$csv" 2>/dev/null ||
    { echo "ncu failed (rc $?); see $csv" >&2; exit 1; }
python3 - "$csv" "$step" <<'EOF'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows or "Kernel Name" not in rows[0]:
    sys.exit("no ncu rows in " + sys.argv[1])
h = rows[0]
ki, ii, mi, vi = h.index("Kernel Name"), h.index("ID"), h.index("Metric Name"), h.index("Metric Value")
per = collections.OrderedDict()
for r in rows[1:]:
    if not r[ii].isdigit():
        continue
    per.setdefault(r[ii], {"name": r[ki].split("(")[0].replace("void ", "").replace(" ", "")})[r[mi]] = float(r[vi].replace(",", ""))
agg = collections.OrderedDict()
for k in per.values():
    a = agg.setdefault(k["name"], collections.defaultdict(float))
    a["n"] += 1
    for m in ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
              "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active"):
        a[m] += k.get(m, 0.0)
    a["grid"] = max(a["grid"], k.get("launch__grid_size", 0))
    a["regs"] = max(a["regs"], k.get("launch__registers_per_thread", 0))
tot = sum(a["gpu__time_duration.sum"] for a in agg.values()) / 1e3
print(f"step {sys.argv[2]}: {sum(int(a['n']) for a in agg.values())} kernels, {tot:.1f} us in all (ncu, each alone)")
print(f"{'kernel':40s} {'n':>4s} {'total us':>9s} {'mean us':>8s} {'share':>6s} {'grid':>6s} {'regs':>4s} {'sm%':>5s} {'dram%':>5s} {'occ%':>5s}")
for name, a in sorted(agg.items(), key=lambda x: -x[1]["gpu__time_duration.sum"]):
    n, t = a["n"], a["gpu__time_duration.sum"] / 1e3
    print(f"{name[:40]:40s} {int(n):4d} {t:9.1f} {t / n:8.2f} {100 * t / tot:5.1f}% {int(a['grid']):6d} {int(a['regs']):4d} "
          f"{a['sm__throughput.avg.pct_of_peak_sustained_elapsed'] / n:5.1f} {a['dram__throughput.avg.pct_of_peak_sustained_elapsed'] / n:5.1f} "
          f"{a['sm__warps_active.avg.pct_of_peak_sustained_active'] / n:5.1f}")
EOF

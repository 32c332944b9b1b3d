#!/usr/bin/env bash
# amx_check.sh [BUILD_DIR] [OUT_FILE] — the AMX kernel's check-and-bench set, for one call on a machine
# whose CPU has AMX-INT8 (built elsewhere; run from the repository root; BUILD_DIR holds isobatch and
# tests/test_matmul, or is a `make gpu-bundle` folder; the caller sets LD_LIBRARY_PATH for the shared libraries the machine lacks).
# Prints each step's result as it goes, appends everything to OUT_FILE, and ends with one summary line.
#   1. the host: CPU model, its AMX flags, the kernels `isobatch --version` says this CPU runs.
#   2. test_matmul: every ISA (amx included) bitwise equal to the numeric definition over the shapes,
#      row counts 1..70, thread counts and weight formats; the amx-group-order fault caught.
#   3. generate digests on models/default (8 prompts x 24 tokens, act q8; KV f32 and f16; --batch 1 and
#      --batch 8 --prefill-chunk 5): --isa scalar, avx512 and amx must give the same digests; one act f32
#      configuration too; --check-serial under amx; --inject amx-group-order must change amx's digests
#      (the engine's products really run on tiles).
#   4. speed: bench_matmul (if BUILD_DIR has it) at 16, 64 and 128 rows, avx512 vs amx; isobatch bench
#      on a qwen3-0.6b-shaped 4-bit model, --isa avx512 vs amx, --batch 1,16,64 --prompt 128 --gen 32
#      --threads 16: prefill and decode tok/s side by side.
# About 2-4 minutes on 16 cores. Exit status 0 when every check passed (the speed figures are not
# judged).
set -u
build=${1:-build}
out=${2:-/tmp/amx_check.txt}
bin=$build/isobatch
test_matmul=$build/tests/test_matmul            # a build folder's place, or a gpu-bundle's (make gpu-bundle)
[ -x "$test_matmul" ] || test_matmul=$build/test_matmul
model=models/default
prompts=examples/prompts.txt
# overridable to try the script itself on another machine (the defaults are the AMX run's)
threads=${AMX_CHECK_THREADS:-16}
base=${AMX_CHECK_BASE_ISA:-avx512} # the ISA amx is compared with
batches=${AMX_CHECK_BATCHES:-1,16,64}
mkdir -p "$(dirname "$out")"
: >"$out"
tmp=$(mktemp -d /tmp/amx_check_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
say() { printf '%s\n' "$*" | tee -a "$out"; }
fails=0
fail() { fails=$((fails + 1)); say "FAIL: $*"; }

# ---- 1. host
say "== amx_check $(date -u '+%Y-%m-%d %H:%M:%S UTC') build $build"
say "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs online"
say "cpu amx flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep '^amx' | tr '\n' ' ')"
if [ ! -x "$bin" ]; then
    fail "$bin missing"
    say "SUMMARY amx_check: $fails failed (no binary)"
    exit 1
fi
say "$("$bin" --version 2>&1 | grep '^kernels')"
amx_here=0
"$bin" --version 2>/dev/null | grep -q '^kernels:.* amx' && amx_here=1
[ $amx_here = 1 ] || fail "isobatch does not list amx among this CPU's kernels (no AMX-INT8, or the OS refused the tile state)"

# ---- 2. test_matmul
t0=$(date +%s)
timeout 600 "$test_matmul" >"$tmp/test_matmul.log" 2>&1
rc=$?
grep -E '^(test_matmul: ISAs|SKIP)' "$tmp/test_matmul.log" | while read -r l; do say "$l"; done
grep -E '^FAIL' "$tmp/test_matmul.log" | head -20 | while read -r l; do say "  $l"; done
tm_line=$(tail -1 "$tmp/test_matmul.log")
say "test_matmul (rc $rc, $(($(date +%s) - t0)) s): $tm_line"
[ $rc = 0 ] || fail "test_matmul rc $rc"
grep -q '^test_matmul: ISAs:.* amx' "$tmp/test_matmul.log" || fail "test_matmul did not run the amx ISA"

# ---- 3. generate digests across ISAs
digests() { # ARGS... -> the prompts' digests on one line, or nothing
    timeout 300 "$bin" generate -m "$model" --prompts-file "$prompts" -n 24 --json "$@" 2>"$tmp/gen.err" \
        | grep -o '"digest": *"[0-9a-f]*"' | tr '\n' ' '
}
t0=$(date +%s)
n_cfg=0 n_same=0
for act in q8 f32; do
    for kv in f32 f16; do
        for sched in "--batch 1" "--batch 8 --prefill-chunk 5"; do
            [ $act = f32 ] && { [ $kv = f16 ] || [ "$sched" = "--batch 1" ]; } && continue # f32: one configuration
            # shellcheck disable=SC2086
            ref=$(digests --isa scalar --act $act --kv-dtype $kv $sched)
            line="act $act kv $kv $sched:"
            ok=1
            for isa in $base amx; do
                # shellcheck disable=SC2086
                d=$(digests --isa $isa --act $act --kv-dtype $kv $sched)
                if [ -z "$d" ]; then
                    line="$line $isa ERROR($(head -c 160 "$tmp/gen.err"))"
                    ok=0
                elif [ "$d" = "$ref" ]; then
                    line="$line $isa=scalar"
                else
                    line="$line $isa DIFFERS"
                    ok=0
                fi
            done
            [ -n "$ref" ] || { line="$line (scalar run failed: $(head -c 160 "$tmp/gen.err"))"; ok=0; }
            n_cfg=$((n_cfg + 1))
            if [ $ok = 1 ]; then n_same=$((n_same + 1)); say "  EQUAL $line"; else say "  DIFF  $line"; fi
        done
    done
done
say "generate digests scalar/$base/amx: $n_same of $n_cfg configurations equal ($(($(date +%s) - t0)) s)"
[ $n_same = $n_cfg ] || fail "digests differ across ISAs"
timeout 300 "$bin" generate -m "$model" --prompts-file "$prompts" -n 24 --isa amx --batch 8 --prefill-chunk 5 \
    --check-serial >"$tmp/serial.log" 2>&1
rc=$?
say "generate --isa amx --batch 8 --prefill-chunk 5 --check-serial (rc $rc): $(grep -i serial "$tmp/serial.log" | tail -1)"
[ $rc = 0 ] || fail "check-serial under amx (rc $rc)"
ref=$(digests --isa scalar --act q8 --batch 8 --prefill-chunk 5)
d=$(digests --isa amx --act q8 --batch 8 --prefill-chunk 5 --inject amx-group-order)
if [ -n "$d" ] && [ -n "$ref" ] && [ "$d" != "$ref" ]; then
    say "generate --isa amx --inject amx-group-order: digests differ from scalar (caught: the products run on tiles)"
else
    fail "generate --isa amx --inject amx-group-order: not caught ($(head -c 160 "$tmp/gen.err"))"
fi

# ---- 4. speed: avx512 vs amx
t0=$(date +%s)
# the kernels alone (optional: BUILD_DIR/bench_matmul, built as bench/bench_matmul.c says): one 1024 -> 3072
# product, Q8 activations, 4- and 8-bit weights, 1 and 2 threads
if [ -x "$build/bench_matmul" ]; then
    for isa in $base amx; do
        IB_BENCH_ISA=$isa timeout 120 "$build/bench_matmul" 16 64 128 >"$tmp/bm_$isa.log" 2>&1
        say "--- bench_matmul --isa $isa (rc $?), Q8-activation rows: isa w act B threads us GB/s GMAC/s"
        grep -E "^$isa +q[48] +q8 " "$tmp/bm_$isa.log" | sed 's/^/  /' | tee -a "$out"
    done
else
    say "(no $build/bench_matmul: the kernel-only timing skipped)"
fi
qm=$tmp/q06
if timeout 300 "$bin" mkmodel --preset qwen3-0.6b --bits 4 --out "$qm" >"$tmp/mkmodel.log" 2>&1; then
    for isa in $base amx; do
        timeout 400 "$bin" bench -m "$qm" --isa $isa --batch "$batches" --prompt 128 --gen 32 --threads "$threads" \
            --reps 3 >"$tmp/bench_$isa.log" 2>&1
        rc=$?
        say "--- isobatch bench --isa $isa (rc $rc)"
        sed 's/^/  /' "$tmp/bench_$isa.log" | tee -a "$out"
        [ $rc = 0 ] || fail "bench --isa $isa rc $rc"
    done
    pbase=$(sed -n 's/^prefill [0-9]* tokens: *\([0-9.]*\) tok\/s.*/\1/p' "$tmp/bench_$base.log")
    pamx=$(sed -n 's/^prefill [0-9]* tokens: *\([0-9.]*\) tok\/s.*/\1/p' "$tmp/bench_amx.log")
    say "$(printf 'speed (tok/s, median of 3)  %10s %10s   amx/%s' "$base" amx "$base")"
    say "$(awk -v a="${pbase:-0}" -v b="${pamx:-0}" 'BEGIN { printf "  prefill 128 tokens       %10.1f %10.1f   %6.2fx", a, b, (a > 0 ? b / a : 0) }')"
    for b in ${batches//,/ }; do
        dbase=$(awk -v b=$b '$1 == b && $2 ~ /^[0-9.]+$/ { print $2; exit }' "$tmp/bench_$base.log")
        damx=$(awk -v b=$b '$1 == b && $2 ~ /^[0-9.]+$/ { print $2; exit }' "$tmp/bench_amx.log")
        say "$(awk -v n=$b -v a="${dbase:-0}" -v c="${damx:-0}" 'BEGIN { printf "  decode batch %-3d         %10.1f %10.1f   %6.2fx", n, a, c, (a > 0 ? c / a : 0) }')"
    done
    speed="prefill $base ${pbase:-?} amx ${pamx:-?} tok/s"
else
    fail "mkmodel --preset qwen3-0.6b --bits 4: $(tail -1 "$tmp/mkmodel.log")"
    speed="no bench"
fi
say "bench: $(($(date +%s) - t0)) s"

say "SUMMARY amx_check: $([ $fails = 0 ] && echo 'all checks passed' || echo "$fails FAILED"); $tm_line; digests $n_same/$n_cfg equal; $speed"
[ $fails = 0 ]

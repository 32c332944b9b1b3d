#!/usr/bin/env bash
# The libFuzzer targets of fuzz/ (built by `make fuzz-build`, clang + ASan/UBSan, in $FUZZ_BUILD),
# each run for a few seconds (FUZZ_TEST_SECONDS, default 4) from its seed corpus in fuzz/corpus/:
# any crash, sanitizer report, leak or timeout fails. Without clang it prints SKIPPED and passes.
# `make fuzz` runs the same targets for FUZZ_SECONDS (default 600) each.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
F=${FUZZ_BUILD:-build-fuzz}
case $F in /*) ;; *) F=$ROOT/$F ;; esac
SECS=${FUZZ_TEST_SECONDS:-4}
pass=0; fail=0
cd "$ROOT"
if ! command -v "${FUZZ_CC:-clang}" >/dev/null; then
    echo "t_fuzz: SKIPPED (no clang: apt-get install clang)"; echo "t_fuzz: 0 passed, 0 failed"; exit 0
fi
T=$(mktemp -d /tmp/ib_fuzzrun_XXXXXX)
trap 'rm -rf "$T"' EXIT
for src in fuzz/fuzz_*.c; do
    name=$(basename "$src" .c); short=${name#fuzz_}
    bin=$F/fuzz/$name
    if [ ! -x "$bin" ]; then echo "FAIL: $bin missing (make fuzz-build)"; fail=$((fail+1)); continue; fi
    mkdir -p "$T/$short"
    if "$bin" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=4096 -max_len=65536 -artifact_prefix="$T/" \
        "$T/$short" "fuzz/corpus/$short" > "$T/$short.log" 2>&1; then
        runs=$(grep -oE 'stat::number_of_executed_units: [0-9]+|Done [0-9]+ runs' "$T/$short.log" | grep -oE '[0-9]+' | tail -1)
        echo "$name: ${runs:-?} runs in $SECS s, no finding"
        pass=$((pass+1))
    else
        echo "FAIL: $name found something:"; grep -E "ERROR|SUMMARY|runtime error|==[0-9]+==" "$T/$short.log" | head -8
        ls "$T"/crash-* "$T"/leak-* "$T"/timeout-* 2>/dev/null | head -3
        fail=$((fail+1))
    fi
done
echo "t_fuzz: $pass passed, $fail failed"
[ $fail = 0 ]

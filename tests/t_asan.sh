#!/usr/bin/env bash
# Runs every unit test binary again from the AddressSanitizer/UndefinedBehaviorSanitizer build
# ($ASAN_BUILD, default build-asan/, made by `make asan`), so bad-input paths are checked for leaks and UB too.
set -u
A=${ASAN_BUILD:-build-asan}
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pass=0; fail=0
[ -d "$A/tests" ] || { echo "t_asan: $A/tests missing (run make asan)"; echo "t_asan: 0 passed, 1 failed"; exit 1; }
for t in "$A"/tests/test_*; do
    [ -x "$t" ] || continue
    out=$("$t" 2>&1); rc=$?
    if [ $rc = 0 ] && ! printf '%s' "$out" | grep -qE "AddressSanitizer|runtime error|LeakSanitizer"; then
        pass=$((pass+1))
    else
        fail=$((fail+1)); echo "FAIL: $(basename "$t") under sanitizers (exit $rc)"
        printf '%s\n' "$out" | grep -E "FAIL|Sanitizer|runtime error" | head -5
    fi
done
echo "t_asan: $pass passed, $fail failed"
[ $fail = 0 ]

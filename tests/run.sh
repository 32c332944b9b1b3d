#!/usr/bin/env bash
# Runs every test binary in $BUILD/tests and every tests/t_*.sh script, adds up their
# "N passed, N failed" lines and prints the total as the closing line.
set -u
BUILD=${BUILD:-build}
total_p=0; total_f=0; broken=0
run_one() {
    local name=$1; shift
    local out rc
    out=$("$@" 2>&1); rc=$?
    local line
    line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -1)
    if [ -z "$line" ]; then
        echo "$out" | tail -20
        echo "$name: no summary (exit $rc)"; broken=$((broken+1)); return
    fi
    local p f
    p=$(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    if [ "$f" != 0 ] || [ $rc != 0 ]; then
        printf '%s\n' "$out" | grep -E 'FAIL|error' | head -30
        [ "$f" = 0 ] && f=1
    fi
    echo "$name: $p passed, $f failed"
    total_p=$((total_p+p)); total_f=$((total_f+f))
}
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for s in tests/t_*.sh; do
    [ -f "$s" ] || continue
    run_one "$(basename "$s")" env BUILD="$BUILD" bash "$s"
done
total_f=$((total_f+broken))
echo
echo "TOTAL: $total_p passed, $total_f failed"
[ $total_f = 0 ]

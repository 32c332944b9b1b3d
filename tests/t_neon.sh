#!/usr/bin/env bash
# The NEON matmul kernel (src/backends/cpu/matmul_neon.c) and the attention copies' test
# (tests/test_attention_isa.c, once under -cpu max) checked from an x86 host: `make neon-test`'s
# binary (tests/test_matmul_neon.c and the matmul sources, cross-built statically for aarch64) runs
# under qemu-aarch64 on a CPU with the int8 dot product (-cpu max: the SDOT and the plain NEON paths)
# and on one without (-cpu cortex-a57: the plain path, and the run-time detection must say "no"); every
# shape, format and activation mode must equal the scalar kernel bit for bit.
# Needs aarch64-linux-gnu-gcc and qemu-aarch64 (Debian: gcc-aarch64-linux-gnu, qemu-user); without them
# it prints a SKIPPED line and counts nothing. On an aarch64 host the native build runs the same test
# directly (build/tests/test_matmul_neon), so this script skips there too.
set -u
BUILD=${BUILD:-build}
CROSS_CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
QEMU_A64=${QEMU_A64:-qemu-aarch64}
if [ "$(uname -m)" = aarch64 ]; then
    echo "t_neon: SKIPPED: aarch64 host, the native build/tests/test_matmul_neon covers NEON"
    echo "t_neon: 0 passed, 0 failed"; exit 0
fi
missing=""
command -v "$CROSS_CC" >/dev/null 2>&1 || missing="$missing $CROSS_CC (package gcc-aarch64-linux-gnu)"
command -v "$QEMU_A64" >/dev/null 2>&1 || missing="$missing $QEMU_A64 (package qemu-user)"
if [ -n "$missing" ]; then
    echo "t_neon: SKIPPED: the NEON kernel is not tested on this machine: missing$missing"
    echo "t_neon: 0 passed, 0 failed"; exit 0
fi
BIN=$BUILD/aarch64/test_matmul_neon
# (a make of its own: not a jobserver child of `make test`, whose MAKEFLAGS would only earn a warning)
if ! log=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s BUILD="$BUILD" CROSS_CC="$CROSS_CC" "$BIN" 2>&1); then
    printf '%s\n' "$log" | tail -20
    echo "t_neon: cross build of $BIN failed"
    echo "t_neon: 0 passed, 1 failed"; exit 1
fi
[ -n "$log" ] && printf '%s\n' "$log"   # warnings
pass=0; fail=0
# cpu:expected dot product
for spec in max:1 cortex-a57:0; do
    cpu=${spec%%:*}
    if ! "$QEMU_A64" -cpu help 2>/dev/null | grep -qw -- "$cpu"; then
        echo "t_neon: SKIPPED -cpu $cpu: this qemu-aarch64 does not offer it"; continue
    fi
    out=$(IB_EXPECT_DOTPROD=${spec#*:} "$QEMU_A64" -cpu "$cpu" "$BIN" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^test_matmul_neon: [0-9]+ passed, [0-9]+ failed' | tail -1)
    p=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) passed.*/\1/p'); f=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
    printf '%s\n' "$out" | grep -E '^test_matmul_neon: (aarch64|[0-9]+ kernel)' | sed "s/^test_matmul_neon:/t_neon: -cpu $cpu:/"
    if [ -z "$line" ] || [ $rc != 0 ]; then
        printf '%s\n' "$out" | grep -E 'FAIL|difference|error' | head -20
        echo "t_neon: -cpu $cpu: FAILED (exit $rc, ${f:-no} failed checks)"
        [ -z "$f" ] || [ "$f" = 0 ] && f=1
    fi
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
done
# the attention copies' test: on aarch64 the portable copy with the NEON half conversion
ABIN=$BUILD/aarch64/test_attention_isa
if ! log=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s BUILD="$BUILD" CROSS_CC="$CROSS_CC" "$ABIN" 2>&1); then
    printf '%s\n' "$log" | tail -20
    echo "t_neon: cross build of $ABIN failed"
    fail=$((fail + 1))
else
    [ -n "$log" ] && printf '%s\n' "$log"
    out=$("$QEMU_A64" -cpu max "$ABIN" 2>&1); rc=$?
    line=$(printf '%s\n' "$out" | grep -E '^test_attention_isa: [0-9]+ passed, [0-9]+ failed' | tail -1)
    p=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) passed.*/\1/p'); f=$(printf '%s' "$line" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
    echo "t_neon: attention under -cpu max: ${line:-no summary}"
    if [ -z "$line" ] || [ $rc != 0 ]; then
        printf '%s\n' "$out" | grep -E 'FAIL|error' | head -20
        [ -z "$f" ] || [ "$f" = 0 ] && f=1
    fi
    pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
fi
echo "t_neon: $pass passed, $fail failed"
[ $fail = 0 ]

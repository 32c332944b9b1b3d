#!/usr/bin/env bash
# Replay verification: every response's verification record re-run alone (POST /v1/verify and
# `isobatch verify`), tampered and bad records, and records of a faulty server (tests/verify_serve.py).
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BUILD in /*) BIN=$BUILD/isobatch ;; *) BIN=$ROOT/$BUILD/isobatch ;; esac
ASAN_BUILD=${ASAN_BUILD:-build-asan}
case $ASAN_BUILD in /*) ;; *) ASAN_BUILD=$ROOT/$ASAN_BUILD ;; esac
SBIN=$ASAN_BUILD/isobatch
[ -x "$SBIN" ] || SBIN=$BIN
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
command -v python3 >/dev/null || { echo "FAIL: python3 not found"; echo "t_verify: 0 passed, 1 failed"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN missing (run make)"; echo "t_verify: 0 passed, 1 failed"; exit 1; }
T=$(mktemp -d /tmp/ib_verify_XXXXXX)
trap 'rm -rf "$T"' EXIT
python3 "$ROOT/tests/verify_serve.py" "$SBIN" "$T"

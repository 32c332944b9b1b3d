#!/usr/bin/env bash
# Sessions that survive their server: `isobatch serve --data-dir` (the ASan/UBSan build when there is
# one) killed with SIGKILL during concurrent generations, and stopped with SIGTERM, then restarted,
# against a reference server that is never killed (tests/store_serve.py says what is checked).
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BUILD in /*) BIN=$BUILD/isobatch ;; *) BIN=$ROOT/$BUILD/isobatch ;; esac
ASAN_BUILD=${ASAN_BUILD:-build-asan}
case $ASAN_BUILD in /*) ;; *) ASAN_BUILD=$ROOT/$ASAN_BUILD ;; esac
SBIN=$ASAN_BUILD/isobatch
[ -x "$SBIN" ] || SBIN=$BIN
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
command -v python3 >/dev/null || { echo "FAIL: python3 not found"; echo "t_store_serve: 0 passed, 1 failed"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN missing (run make)"; echo "t_store_serve: 0 passed, 1 failed"; exit 1; }
T=$(mktemp -d /tmp/ib_store_serve_XXXXXX)
trap 'rm -rf "$T"' EXIT
python3 "$ROOT/tests/store_serve.py" "$SBIN" "$T"

#!/usr/bin/env bash
# Replay verification: every response's verification record re-run alone (POST /v1/verify and
# `isobatch verify`), tampered and bad records, records of a server keeping 8-bit KV, and records of a
# faulty server (tests/verify_serve.py).
set -u
. "$(dirname "$0")/server_bins.sh"
command -v python3 >/dev/null || { echo "FAIL: python3 not found"; echo "t_verify: 0 passed, 1 failed"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN missing (run make)"; echo "t_verify: 0 passed, 1 failed"; exit 1; }
T=$(mktemp -d /tmp/ib_verify_XXXXXX)
export ISOBATCH_DATA_DIR=$T/data  # the default store of a server started without --store
trap 'rm -rf "$T"' EXIT
python3 "$ROOT/tests/verify_serve.py" "$SBIN" "$T"

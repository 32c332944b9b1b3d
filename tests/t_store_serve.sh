#!/usr/bin/env bash
# Sessions that survive their server: `isobatch serve --data-dir` (the ASan/UBSan build when there is
# one) killed with SIGKILL during concurrent generations, and stopped with SIGTERM, then restarted,
# against a reference server that is never killed (tests/store_serve.py says what is checked).
set -u
. "$(dirname "$0")/server_bins.sh"
command -v python3 >/dev/null || { echo "FAIL: python3 not found"; echo "t_store_serve: 0 passed, 1 failed"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN missing (run make)"; echo "t_store_serve: 0 passed, 1 failed"; exit 1; }
T=$(mktemp -d /tmp/ib_store_serve_XXXXXX)
export ISOBATCH_DATA_DIR=$T/data  # the default store of a server started without --store
trap 'rm -rf "$T"' EXIT
python3 "$ROOT/tests/store_serve.py" "$SBIN" "$T"

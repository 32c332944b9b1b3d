#!/usr/bin/env bash
# Two `isobatch serve` replicas (the ASan/UBSan build when there is one) behind HAProxy, sharing a
# PostgreSQL session store (a private server: tests/pg_server.sh); a replica killed mid-conversation,
# the conversation continued on the other bit for bit (tests/scaleout.py says what is checked).
# Needs Debian's haproxy and postgresql packages.
set -u
. "$(dirname "$0")/server_bins.sh"
die() { echo "FAIL: $*"; echo "t_scaleout: 0 passed, 1 failed"; exit 1; }
command -v python3 >/dev/null || die "python3 not found"
command -v haproxy >/dev/null || die "haproxy not found (apt-get install haproxy)"
[ -x "$BIN" ] || die "$BIN missing (run make)"
. "$ROOT/tests/pg_server.sh"
T=$(mktemp -d /tmp/ib_scaleout_XXXXXX)
export ISOBATCH_DATA_DIR=$T/data  # the default store of a server started without --store
P=$(mktemp -d /tmp/ib_scaleout_pg_XXXXXX)
trap 'pg_cleanup; rm -rf "$T" "$P"' EXIT
pg_start "$P" || die "no PostgreSQL server"
python3 "$ROOT/tests/scaleout.py" "$SBIN" "$T" "$PG_URI"

#!/usr/bin/env bash
# The session store on PostgreSQL: starts a private PostgreSQL server on loopback in a temporary
# directory (tests/pg_server.sh), runs
#   - build/tests/pg_store_check all URI (the ASan build's when there is one): the checks in
#     tests/pg_store_check.c;
#   - the server-kill test: a writer appends and prints what was acknowledged while the whole
#     server (postmaster and backends) is killed with SIGKILL; after a restart (crash recovery from
#     its log) every acknowledged token is there and nothing half-written is;
# then stops the server and removes the directory.
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
ASAN_BUILD=${ASAN_BUILD:-build-asan}
case $ASAN_BUILD in /*) ;; *) ASAN_BUILD=$ROOT/$ASAN_BUILD ;; esac
CHECK=$ASAN_BUILD/tests/pg_store_check
[ -x "$CHECK" ] || CHECK=$BUILD/tests/pg_store_check
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
finish() { echo "t_store_pg: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit; }

[ -x "$CHECK" ] || { bad "$CHECK missing (run make test)"; finish; }
. "$ROOT/tests/pg_server.sh"
T=$(mktemp -d /tmp/ib_pg_XXXXXX)
cleanup() { pg_cleanup; rm -rf "$T"; }
trap cleanup EXIT
pg_start "$T" || { bad "no PostgreSQL server"; finish; }
URI=$PG_URI

# ---- the checks of pg_store_check.c
out=$("$CHECK" all "$URI" 2>&1); rc=$?
line=$(printf '%s\n' "$out" | grep -E '^pg_store_check: [0-9]+ passed, [0-9]+ failed' | tail -1)
if [ -n "$line" ]; then
    p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    pass=$((pass+p)); fail=$((fail+f))
    [ "$f" = 0 ] || printf '%s\n' "$out" | grep -E "FAIL|ERROR|Sanitizer" | head -20
    [ $rc = 0 ] || [ "$f" != 0 ] || bad "pg_store_check exited $rc"
else
    printf '%s\n' "$out" | tail -20; bad "pg_store_check all: no summary (exit $rc)"
fi
grep -qE "AddressSanitizer|LeakSanitizer|runtime error" <<<"$out" && bad "sanitizer report in pg_store_check" || ok

# ---- kill -9 of the whole server while a writer appends
"$CHECK" write "$URI" srvkill 77 >"$T/acks" 2>"$T/writer.err" &
WP=$!
for _ in $(seq 1 100); do [ "$(wc -l <"$T/acks")" -ge 20 ] && break; sleep 0.1; done
# the postmaster and every backend at once: nothing gets to shut down cleanly
pg_kill
wait $WP
acked=$(tail -1 "$T/acks")
[ "${acked:-0}" -gt 0 ] && ok || bad "the writer acknowledged nothing before the kill ($(cat "$T/writer.err"))"
grep -q "writer srvkill: store" "$T/writer.err" && ok || bad "the writer did not report the lost server: $(cat "$T/writer.err")"
pg_restart || { bad "the server did not restart after SIGKILL"; finish; }
grep -q "not properly shut down\|crash recovery\|redo" "$PG_DIR/pg.log" && ok || bad "the restart did no crash recovery (was it killed?)"
out=$("$CHECK" verify "$URI" srvkill 77 "${acked:-0}" 2>&1); rc=$?
line=$(printf '%s\n' "$out" | grep -E 'passed, [0-9]+ failed' | tail -1)
p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
if [ -n "$line" ]; then pass=$((pass+p)); fail=$((fail+f)); [ "$f" = 0 ] || printf '%s\n' "$out" | grep FAIL; else bad "verify: no summary: $out"; fi

pg_stop && ok || bad "the server did not stop"
finish

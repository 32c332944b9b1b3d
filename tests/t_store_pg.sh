#!/usr/bin/env bash
# The session store on PostgreSQL: starts a private PostgreSQL server (Debian's postgresql package)
# on loopback in a temporary directory, as an unprivileged user (PostgreSQL refuses to run as root:
# under root the cluster belongs to the package's "postgres" user), runs
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
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ] || { bad "PostgreSQL is not installed (apt-get install postgresql)"; finish; }

T=$(mktemp -d /tmp/ib_pg_XXXXXX)
chmod 755 "$T"
AS=()
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || { bad "running as root and there is no 'postgres' user to run the server as"; rm -rf "$T"; finish; }
    chown postgres "$T"
    AS=(runuser -u postgres --)
fi
pgctl() { "${AS[@]}" "$PGBIN/pg_ctl" -D "$T/data" "$@"; }
cleanup() {
    [ -f "$T/data/postmaster.pid" ] && pgctl -m immediate stop >/dev/null 2>&1
    rm -rf "$T"
}
trap cleanup EXIT

# a free loopback port
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${AS[@]}" "$PGBIN/initdb" -D "$T/data" -U isobatch -A trust --no-instructions >"$T/initdb.log" 2>&1 \
    || { cat "$T/initdb.log"; bad "initdb failed"; finish; }
start_pg() {
    pgctl -w -t 60 -l "$T/pg.log" -o "-p $PORT -k $T -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on" start >/dev/null 2>&1
}
start_pg || { tail -20 "$T/pg.log"; bad "the PostgreSQL server did not start"; finish; }
URI="postgresql://isobatch@127.0.0.1:$PORT/postgres"

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
PM=$(head -1 "$T/data/postmaster.pid")
KIDS=$(pgrep -P "$PM" | tr '\n' ' ')
# the postmaster and every backend at once: nothing gets to shut down cleanly
kill -KILL $KIDS "$PM" 2>/dev/null
wait $WP
acked=$(tail -1 "$T/acks")
[ "${acked:-0}" -gt 0 ] && ok || bad "the writer acknowledged nothing before the kill ($(cat "$T/writer.err"))"
grep -q "writer srvkill: store" "$T/writer.err" && ok || bad "the writer did not report the lost server: $(cat "$T/writer.err")"
for _ in $(seq 1 50); do
    alive=0; for p in $KIDS $PM; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break; sleep 0.1
done
# what a killed postmaster leaves behind: its pid file and its socket's lock file
rm -f "$T/data/postmaster.pid" "$T/.s.PGSQL.$PORT.lock" "$T/.s.PGSQL.$PORT"
start_pg || { tail -20 "$T/pg.log"; bad "the server did not restart after SIGKILL"; finish; }
grep -q "not properly shut down\|crash recovery\|redo" "$T/pg.log" && ok || bad "the restart did no crash recovery (was it killed?)"
out=$("$CHECK" verify "$URI" srvkill 77 "${acked:-0}" 2>&1); rc=$?
line=$(printf '%s\n' "$out" | grep -E 'passed, [0-9]+ failed' | tail -1)
p=$(echo "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
if [ -n "$line" ]; then pass=$((pass+p)); fail=$((fail+f)); [ "$f" = 0 ] || printf '%s\n' "$out" | grep FAIL; else bad "verify: no summary: $out"; fi

pgctl -m fast stop >/dev/null 2>&1 && ok || bad "the server did not stop"
finish

# pg_server.sh — sourced by tests that need a PostgreSQL server: starts a private one on loopback in
# a temporary directory and stops it. Debian's postgresql package; PostgreSQL refuses to run as
# root, so under root the cluster belongs to the package's "postgres" user.
#   pg_start DIR   initdb in DIR/data (DIR must exist) and start the server on a free loopback port;
#                  sets PG_URI (postgresql://isobatch@127.0.0.1:PORT/postgres), PG_PORT, PG_DIR.
#                  Returns non-zero with a message on stderr when it cannot.
#   pg_restart     start the server of pg_start again (after pg_kill), crash recovery included.
#   pg_kill        SIGKILL the postmaster and every backend at once, and wait until they are gone.
#   pg_stop        stop it (fast shutdown); pg_cleanup stops it immediately if it still runs.

pg_as() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
pg_ctl_() { pg_as "$PG_BIN/pg_ctl" -D "$PG_DIR/data" "$@"; }

pg_start() {
    PG_DIR=$1
    PG_BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/initdb" ]; then
        echo "PostgreSQL is not installed (apt-get install postgresql)" >&2; return 1
    fi
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || { echo "running as root and there is no 'postgres' user to run the server as" >&2; return 1; }
        chown postgres "$PG_DIR"
    fi
    chmod 755 "$PG_DIR"
    PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    pg_as "$PG_BIN/initdb" -D "$PG_DIR/data" -U isobatch -A trust --no-instructions >"$PG_DIR/initdb.log" 2>&1 \
        || { cat "$PG_DIR/initdb.log" >&2; echo "initdb failed" >&2; return 1; }
    PG_URI="postgresql://isobatch@127.0.0.1:$PG_PORT/postgres"
    pg_restart
}

pg_restart() {
    pg_ctl_ -w -t 60 -l "$PG_DIR/pg.log" \
        -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on" start >/dev/null 2>&1 \
        || { tail -20 "$PG_DIR/pg.log" >&2; echo "the PostgreSQL server did not start" >&2; return 1; }
}

pg_kill() {
    local pm kids alive p
    pm=$(head -1 "$PG_DIR/data/postmaster.pid")
    kids=$(pgrep -P "$pm" | tr '\n' ' ')
    kill -KILL $kids "$pm" 2>/dev/null
    for _ in $(seq 1 50); do
        alive=0; for p in $kids $pm; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break; sleep 0.1
    done
    # what a killed postmaster leaves behind: its pid file and its socket's lock file
    rm -f "$PG_DIR/data/postmaster.pid" "$PG_DIR/.s.PGSQL.$PG_PORT.lock" "$PG_DIR/.s.PGSQL.$PG_PORT"
}

pg_stop() { pg_ctl_ -m fast stop >/dev/null 2>&1; }
pg_cleanup() { [ -n "${PG_DIR:-}" ] && [ -f "$PG_DIR/data/postmaster.pid" ] && pg_ctl_ -m immediate stop >/dev/null 2>&1; return 0; }

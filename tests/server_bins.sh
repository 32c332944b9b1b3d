# server_bins.sh — sourced by the server test scripts: which binaries they run.
#   ROOT  the repository; BIN  $BUILD/isobatch (BUILD defaults to build);
#   SBIN  the sanitizer build's isobatch ($ASAN_BUILD, default build-asan) when it exists, else BIN;
#   ISOBATCH_DATA_DIR exported to a directory that cannot be created (scripts set their own);
#   the sanitizers' options exported (leaks reported, UBSan stops at the first error with a stack).
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case $BUILD in /*) BIN=$BUILD/isobatch ;; *) BIN=$ROOT/$BUILD/isobatch ;; esac
ASAN_BUILD=${ASAN_BUILD:-build-asan}
case $ASAN_BUILD in /*) ;; *) ASAN_BUILD=$ROOT/$ASAN_BUILD ;; esac
SBIN=$ASAN_BUILD/isobatch
[ -x "$SBIN" ] || SBIN=$BIN
# A server started without --store keeps its sessions in the data directory, by default under $HOME:
# a test must never write there. Each script exports ISOBATCH_DATA_DIR to a directory of its own
# (under its temporary folder); until it does, this one cannot be created, so a server the script
# forgot to point elsewhere fails to start instead of writing into the real home directory.
export ISOBATCH_DATA_DIR=/dev/null/set-ISOBATCH_DATA_DIR-in-the-test
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# serve_start NAME MODEL_DIR ARGS...: `$SBIN serve -m MODEL_DIR` on a free 127.0.0.1 port (2 threads, no
# store, its stderr in $T/NAME.log, ARGS added), waited for (up to 20 s) through its port file; sets
# PORT, U (its base URL) and LAST_PID and adds the pid to PIDS. The calling script defines T, PIDS, bad
# and finish; a server that does not start ends the test.
serve_start() {
    local name=$1 model=$2
    shift 2
    rm -f "$T/$name.port"
    "$SBIN" serve -m "$model" --port 0 --port-file "$T/$name.port" --threads 2 --store none "$@" 2> "$T/$name.log" &
    PIDS+=($!)
    LAST_PID=$!
    for _ in $(seq 1 200); do [ -s "$T/$name.port" ] && break; sleep 0.1; done
    [ -s "$T/$name.port" ] || { cat "$T/$name.log"; bad "$name: server did not start"; finish; }
    PORT=$(cat "$T/$name.port")
    U=http://127.0.0.1:$PORT
}

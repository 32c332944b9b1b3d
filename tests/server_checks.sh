# server_checks.sh — sourced by t_serve.sh, t_harden.sh and t_tools.sh (after T, ok and bad are set):
# checks on a server that serve_start (server_bins.sh) started.
#   STOP_TIMEOUT_S  how long stop waits for a server to exit (whole seconds; 10 unless the script sets
#                   its own after sourcing this file)
#   REQ_TIMEOUT_S   how long req lets one request take (whole seconds; 30 unless the script sets its own)

STOP_TIMEOUT_S=10
REQ_TIMEOUT_S=30

# stop PID NAME: SIGTERM to server PID (a child of this shell), wait up to $STOP_TIMEOUT_S s for it to
# exit (still running then: one bad, SIGKILL, return), then one check that it exited 0 and one that
# $T/NAME.log holds no sanitizer report (ASan, UBSan or LeakSanitizer; its head printed when it does).
stop() {
    local pid=$1 name=$2 rc
    kill -TERM "$pid"
    for _ in $(seq 1 $((STOP_TIMEOUT_S * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then bad "$name: did not stop within $STOP_TIMEOUT_S s"; kill -KILL "$pid"; return; fi
    wait "$pid"; rc=$?
    [ $rc = 0 ] && ok || bad "$name: exit $rc"
    if grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$T/$name.log"; then bad "$name: sanitizer report"; head -40 "$T/$name.log"; else ok; fi
}

# req EXPECTED_CODE NAME CURL_ARGS...: one curl request ($REQ_TIMEOUT_S s at most) with CURL_ARGS, and one check
# that its HTTP status is EXPECTED_CODE (a failure shows the status and the body's head); the body is
# left in $T/body and the response headers in $T/hdr for the checks that follow.
req() {
    local want=$1 name=$2; shift 2
    local code
    code=$(curl -s -m "$REQ_TIMEOUT_S" -o "$T/body" -D "$T/hdr" -w '%{http_code}' "$@")
    if [ "$code" = "$want" ]; then ok; else bad "$name: HTTP $code, want $want: $(head -c 300 "$T/body")"; fi
}

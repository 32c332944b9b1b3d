#!/usr/bin/env bash
# Hardening tests of `isobatch serve` and the tokenizer CLI (the ASan/UBSan build when there is one):
# no request can take the server down, hold it for minutes, or starve other clients.
#   - text with long runs of combining marks tokenizes in near-linear time (CLI and server);
#   - a session's KV is capped by the model's context and the memory budget (400, never an attempt
#     to allocate it), "kv": null is the default, the default budget comes from the machine, and the
#     server's RSS stays small while clients ask for huge windows;
#   - slowloris: connections that trickle a request are closed at the request deadline, one client
#     address gets a bounded number of connections, /healthz answers meanwhile; an oversized chunked
#     body gets its 413 without being read to the end;
#   - chat roles are validated by one function for chat/completions and a session's append;
#   - per-key quotas (sessions' KV, requests in flight) keep one key from locking the others out,
#     a free batch slot goes to the key that waited, idle sessions expire (reported in the object);
#   - SIGTERM drains: in-flight generations finish, those past --drain-timeout end properly;
#   - ISOBATCH_API_KEY="" is refused.
set -u
. "$(dirname "$0")/server_bins.sh"
. "$(dirname "$0")/server_checks.sh"   # stop, req
STOP_TIMEOUT_S=15
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_harden_XXXXXX)
export ISOBATCH_DATA_DIR=$T/data  # the default store of a server started without --store
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
finish() { echo "t_harden: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit; }
HC=$ROOT/tests/hostile_client.py
command -v curl >/dev/null || { bad "curl not found (apt-get install curl)"; finish; }
command -v python3 >/dev/null || { bad "python3 not found"; finish; }
[ -x "$BIN" ] || { bad "$BIN missing (run make)"; finish; }
"$BIN" mkmodel --preset tiny --seed 9 --out "$T/tiny" >/dev/null || { bad "mkmodel"; finish; }

start() { serve_start "$@"; }
# wait (up to 10 s) until N generations are being stepped, so a signal sent next finds them in flight
wait_active() {
    local n=$1
    for _ in $(seq 1 100); do
        curl -s -m 2 "$U/metrics" | grep -q "^isobatch_jobs_active $n\$" && return 0
        sleep 0.1
    done
    bad "$n generations never became active"
}
jget() { python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$T/body" "$1" 2>/dev/null; }
err_is() { [ "$(jget 'b["error"]["code"]')" = "$1" ] && ok || bad "$2: error body $(head -c 300 "$T/body")"; }
metric() { curl -s "$U/metrics" | grep "^$1 " | cut -d' ' -f2; }

# ---- 1. combining marks: 'a' + 65,536 marks alternating U+0301 / U+0316 (quadratic reordering
# took ~27 s on this input; the budget here is 10 s for the ASan build, most of it start-up)
python3 -c 'import sys; sys.stdout.write("a" + "\u0301\u0316" * 32768)' > "$T/marks.txt"
t0=$(date +%s.%N)
timeout 20 "$SBIN" tokenize --tokenizer "$ROOT/models/default/tokenizer.json" --file "$T/marks.txt" --json > "$T/marks.json" 2> "$T/e"
rc=$?; t1=$(date +%s.%N)
el=$(echo "$t1 - $t0" | bc)
[ $rc = 0 ] && [ "$(echo "$el < 10" | bc)" = 1 ] && ok || bad "tokenize --file of 65,536 combining marks: exit $rc in $el s $(head -c 200 "$T/e")"
start marks "$ROOT/models/default" --max-body 2000000 --max-prompt-tokens 200000
python3 -c 'import json,sys; sys.stdout.write(json.dumps({"model":"default","prompt":"a"+"\u0301\u0316"*131072,"max_tokens":1}))' > "$T/marks.body"
t0=$(date +%s.%N)
req 400 "completion of 262,144 combining marks" -H "Content-Type: application/json" "$U/v1/completions" --data-binary @"$T/marks.body"
t1=$(date +%s.%N)
el=$(echo "$t1 - $t0" | bc)
err_is context_length_exceeded "completion of 262,144 combining marks"
[ "$(echo "$el < 10" | bc)" = 1 ] && ok || bad "completion of 262,144 combining marks answered in $el s (want < 10)"
req 200 "healthz after the marks" "$U/healthz"
stop "$LAST_PID" marks

# ---- 2. KV caps and the default budget
start kv "$T/tiny" --api-key key-a
A=(-H "Authorization: Bearer key-a")
grep -q "KV budget [0-9]* MiB (default" "$T/kv.log" && ok || bad "no default KV budget in the log: $(head -3 "$T/kv.log")"
budget=$(metric isobatch_kv_budget_bytes)
[ -n "$budget" ] && [ "$budget" -gt 0 ] && ok || bad "default budget: isobatch_kv_budget_bytes = '$budget'"
for w in "window:2000000" "window:16777216" "sink:4,window:2045" "sink:2147483647,window:2147483647"; do
    req 400 "kv $w" "${A[@]}" -X POST "$U/v1/sessions" -d "{\"kv\":\"$w\"}"
    err_is invalid_value "kv $w"
done
req 200 "kv window as wide as the context" "${A[@]}" -X POST "$U/v1/sessions" -d '{"kv":"sink:4,window:2044"}'
req 200 "kv null is the default" "${A[@]}" -X POST "$U/v1/sessions" -d '{"kv":null}'
[ "$(jget 'b["kv_policy"]')" = full ] && ok || bad "kv null: $(head -c 300 "$T/body")"
req 400 "max_context over the model's" "${A[@]}" -X POST "$U/v1/sessions" -d '{"max_context":16777216}'
# RSS stays bounded while clients ask for huge windows
for i in $(seq 1 30); do curl -s -o /dev/null "${A[@]}" -X POST "$U/v1/sessions" -d '{"kv":"window:16777216"}'; done
rss=$(awk '/^VmRSS/ {print $2}' "/proc/$LAST_PID/status")
[ -n "$rss" ] && [ "$rss" -lt 600000 ] && ok || bad "server RSS ${rss} kB after 30 huge-window requests"
stop "$LAST_PID" kv
# a small budget: a session larger than all of it is a 400, one that fits but finds it in use a 429
start budget "$T/tiny" --memory-budget 1M
req 400 "session larger than the budget" -X POST "$U/v1/sessions" -d '{"max_context":2000}'
req 200 "session within the budget" -X POST "$U/v1/sessions" -d '{"max_context":600}'
req 429 "session when the budget is in use" -X POST "$U/v1/sessions" -d '{"max_context":600}'
err_is memory_budget_exceeded "session when the budget is in use"
stop "$LAST_PID" budget

# ---- 3. slowloris, per-client limits, the request deadline, chunked 413
start loris "$T/tiny" --request-timeout 2 --max-client-connections 8 --max-connections 64 --max-body 20000
python3 "$HC" slowloris "$PORT" 24 5 > "$T/loris" 2>&1 &
LORIS=$!
sleep 1
t0=$(date +%s.%N)
req 200 "healthz during slowloris" -m 3 "$U/healthz"
req 200 "completion during slowloris" -m 10 "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":4}'
wait $LORIS
refused=$(awk '/^refused/ {print $2}' "$T/loris"); cut=$(awk '/^cut/ {print $2}' "$T/loris")
last=$(awk '/^cut/ {print $3}' "$T/loris"); held=$(awk '/^held/ {print $2}' "$T/loris")
[ "$refused" = 16 ] && ok || bad "one address past its 8 connections: $refused of 24 refused, want 16 ($(tr '\n' ' ' < "$T/loris"))"
[ "$cut" = 8 ] && [ "$held" = 0 ] && ok || bad "trickling connections not cut at the request deadline: $(tr '\n' ' ' < "$T/loris")"
[ -n "$last" ] && [ "$(echo "$last < 4.5" | bc)" = 1 ] && ok || bad "trickling connections cut late ($last s, deadline 2 s)"
n=$(metric isobatch_request_timeouts_total)
[ "$n" = 8 ] && ok || bad "isobatch_request_timeouts_total = '$n', want 8"
# a kept-alive connection gets a fresh deadline per request: two requests 1.5 s apart on one socket
python3 - "$PORT" > "$T/ka" <<'PY'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
for i in range(2):
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    s.settimeout(3)
    r = b""
    while b'"status"' not in r:  # the whole response (headers and the small JSON body)
        d = s.recv(4096)
        if not d:
            break
        r += d
    print(r.split(b"\r\n")[0].decode())
    time.sleep(1.5)
PY
[ "$(grep -c 'HTTP/1.1 200' "$T/ka")" = 2 ] && ok || bad "keep-alive requests: $(cat "$T/ka")"
python3 "$HC" chunked "$PORT" 30000 3 > "$T/chunk"
grep -q "413" "$T/chunk" && ok || bad "oversized chunked body: '$(cat "$T/chunk")' within 3 s, want a 413 before the body ends"
req 200 "served after the abuse" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":4}'
stop "$LAST_PID" loris

# ---- 5. chat roles: one validation for chat/completions and a session's append
start roles "$T/tiny"
req 200 "roles: session" -X POST "$U/v1/sessions" -d '{}'
SID=$(jget 'b["id"]')
for role in robot 'user<|im_end|>' 'User' ''; do
    req 400 "append role '$role'" "$U/v1/sessions/$SID/append" -d "{\"messages\":[{\"role\":\"$role\",\"content\":\"hi\"}]}"
    err_is invalid_value "append role '$role'"
    req 400 "chat role '$role'" "$U/v1/chat/completions" -d "{\"model\":\"tiny\",\"messages\":[{\"role\":\"$role\",\"content\":\"hi\"}]}"
done
req 400 "append: message not an object" "$U/v1/sessions/$SID/append" -d '{"messages":["hi"]}'
req 200 "append: developer, user" "$U/v1/sessions/$SID/append" -d '{"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"}]}'
[ "$(jget 'b["pending_tokens"] > 0')" = True ] && ok || bad "append: $(head -c 300 "$T/body")"
stop "$LAST_PID" roles

# ---- 6. per-key quotas, fair scheduling, idle expiry
KA=(-H "Authorization: Bearer key-a"); KB=(-H "Authorization: Bearer key-b")
# 64 MiB over two keys: 32 MiB each; a 2,048-token session of the tiny model takes 2 MiB
start quota "$T/tiny" --api-key key-a --api-key key-b --memory-budget 64M --session-idle-timeout 2
n=0
for i in $(seq 1 40); do
    code=$(curl -s -o "$T/body" -w '%{http_code}' "${KA[@]}" -X POST "$U/v1/sessions" -d '{"max_context":2048}')
    [ "$code" = 200 ] && n=$((n+1)) || break
done
[ $n = 16 ] && [ "$code" = 429 ] && ok || bad "key-a got $n sessions of 2 MiB under its 32 MiB share (last HTTP $code: $(head -c 200 "$T/body"))"
err_is key_memory_quota_exceeded "key-a over its KV quota"
req 200 "key-b still gets a session" "${KB[@]}" -X POST "$U/v1/sessions" -d '{"max_context":2048}'
BSID=$(jget 'b["id"]')
it=$(jget 'b["idle_timeout"]'); ex=$(jget 'b["expires_at"]'); nowt=$(date +%s)
[ "$it" = 2 ] && [ -n "$ex" ] && [ "$ex" -ge "$nowt" ] && [ "$ex" -le $((nowt + 3)) ] && ok || bad "session object: idle_timeout '$it', expires_at '$ex' (now $nowt)"
req 200 "key-b completion while key-a holds its share" "${KB[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":4}'
# idle sessions expire (2 s here) and give their memory and their key's share back
sleep 3.5
req 404 "an idle session has expired" "${KB[@]}" "$U/v1/sessions/$BSID"
[ "$(metric isobatch_sessions_expired_total)" = 17 ] && ok || bad "expired sessions: $(metric isobatch_sessions_expired_total), want 17"
[ "$(metric isobatch_kv_bytes)" = 0 ] && ok || bad "KV bytes after expiry: $(metric isobatch_kv_bytes)"
req 200 "key-a gets sessions again" "${KA[@]}" -X POST "$U/v1/sessions" -d '{"max_context":2048}'
stop "$LAST_PID" quota
# in-flight requests per key, and turns between keys: one batch slot, 20 ms per token
start fair "$T/tiny" --api-key key-a --api-key key-b --max-batch 1 --max-queue 8 --key-max-requests 4 --token-delay-ms 20
FP=()
for i in 1 2 3 4; do
    ( curl -s -o /dev/null "${KA[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"a","max_tokens":50,"temperature":0}'; date +%s.%N > "$T/fa$i" ) &
    FP+=($!)
    sleep 0.1
done
req 429 "key-a's fifth request in flight" "${KA[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"a","max_tokens":2}'
err_is key_request_limit "key-a's fifth request in flight"
( curl -s -o /dev/null -w '%{http_code}' "${KB[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"b","max_tokens":50,"temperature":0}' > "$T/fbcode"; date +%s.%N > "$T/fb" ) &
FP+=($!)
wait "${FP[@]}"
# key-b queued behind three of key-a's requests, and was admitted at the first free slot
[ "$(cat "$T/fbcode")" = 200 ] && [ "$(echo "$(cat "$T/fb") < $(cat "$T/fa3")" | bc)" = 1 ] && ok \
    || bad "key-b's request (HTTP $(cat "$T/fbcode")) finished after key-a's queued ones: b $(cat "$T/fb"), a3 $(cat "$T/fa3")"
stop "$LAST_PID" fair

# ---- 7. SIGTERM: in-flight generations finish (up to --drain-timeout), then the rest end properly
start drain "$T/tiny" --token-delay-ms 20 --drain-timeout 10
DP=$LAST_PID
curl -s -N -m 30 "$U/v1/completions" -d '{"model":"tiny","prompt":"a","max_tokens":40,"seed":0,"stream":true}' > "$T/d_sse" &
D1=$!
curl -s -m 30 -o "$T/d_plain" -w '%{http_code}' "$U/v1/completions" -d '{"model":"tiny","prompt":"a","max_tokens":40,"seed":0}' > "$T/d_code" &
D2=$!
wait_active 2
kill -TERM "$DP"
sleep 0.3
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$U/healthz"); [ "$code" = 000 ] || [ "$code" = 503 ] && ok || bad "a request during the drain got HTTP $code"
wait $D1 $D2
grep -q '"finish_reason":"length"' "$T/d_sse" && tail -c 100 "$T/d_sse" | grep -q 'data: \[DONE\]' && ok || bad "a stream in flight at SIGTERM did not finish: $(tail -c 300 "$T/d_sse")"
[ "$(cat "$T/d_code")" = 200 ] && grep -q '"completion_tokens":40' "$T/d_plain" && ok || bad "a request in flight at SIGTERM: HTTP $(cat "$T/d_code") $(head -c 300 "$T/d_plain")"
wait "$DP"; rc=$?
[ $rc = 0 ] && ok || bad "drain: exit $rc"
grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$T/drain.log" && bad "drain: sanitizer report" || ok
# past the drain deadline (1 s) the rest is ended: the stream with its final chunk, the plain request 503
rm -f "$T/d_plain" "$T/d_sse" "$T/d_code"
start drain2 "$T/tiny" --token-delay-ms 20 --drain-timeout 1
DP=$LAST_PID
curl -s -N -m 30 "$U/v1/completions" -d '{"model":"tiny","prompt":"a","max_tokens":1000,"seed":0,"stream":true}' > "$T/d_sse" &
D1=$!
curl -s -m 30 -o "$T/d_plain" -w '%{http_code}' "$U/v1/completions" -d '{"model":"tiny","prompt":"a","max_tokens":1000,"seed":0}' > "$T/d_code" &
D2=$!
wait_active 2
t0=$(date +%s.%N)
kill -TERM "$DP"
wait $D1 $D2
el=$(echo "$(date +%s.%N) - $t0" | bc)
grep -q '"finish_reason":"cancelled"' "$T/d_sse" && tail -c 100 "$T/d_sse" | grep -q 'data: \[DONE\]' && ok || bad "a stream past the drain deadline: $(tail -c 300 "$T/d_sse")"
[ "$(cat "$T/d_code")" = 503 ] && grep -q server_shutting_down "$T/d_plain" && ok || bad "a plain request past the drain deadline: HTTP $(cat "$T/d_code") $(head -c 300 "$T/d_plain")"
[ "$(echo "$el < 5" | bc)" = 1 ] && ok || bad "clients ended $el s after SIGTERM (drain 1 s)"
wait "$DP"; rc=$?
[ $rc = 0 ] && ok || bad "drain2: exit $rc"
grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$T/drain2.log" && bad "drain2: sanitizer report" || ok

# ---- 4. an empty ISOBATCH_API_KEY is refused, as --api-key "" is
ISOBATCH_API_KEY= timeout 10 "$BIN" serve -m "$T/tiny" --port 0 2> "$T/e"; rc=$?
[ $rc = 2 ] && grep -q "ISOBATCH_API_KEY is set but empty" "$T/e" && ok || bad "ISOBATCH_API_KEY='': exit $rc: $(cat "$T/e")"
timeout 10 "$BIN" serve -m "$T/tiny" --port 0 --api-key "" 2> "$T/e"; [ $? = 2 ] && ok || bad "--api-key '' accepted"
finish

#!/usr/bin/env bash
# Server tests: `isobatch serve` (the ASan/UBSan build when there is one) on a tiny synthetic model,
# on a free 127.0.0.1 port, exercised with curl and with the official openai npm client
# (tests/openai_client, installed with `npm ci` when missing; the test fails loudly without it):
#   - health, models, metrics; completions and chat, plain and SSE;
#   - stateful sessions: create/append/generate/info/delete, KV kept between requests (two 4-token
#     generations equal one 8-token generation, and equal a completion of the same tokens);
#   - 4xx with OpenAI-style error bodies: malformed JSON, wrong types, unknown model, oversized body,
#     too many tokens, wrong or missing key, another tenant's session, 429 + Retry-After over capacity;
#   - a client that disconnects mid-stream frees its slot and its KV memory;
#   - invariance under load (openai client): greedy, seeded and chat requests bitwise identical alone
#     and among 31 concurrent others — and the same check fails when the server runs with a fault;
#   - a clean SIGTERM stop with no sanitizer report.
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BUILD in /*) BIN=$BUILD/isobatch ;; *) BIN=$ROOT/$BUILD/isobatch ;; esac
ASAN_BUILD=${ASAN_BUILD:-build-asan}
case $ASAN_BUILD in /*) ;; *) ASAN_BUILD=$ROOT/$ASAN_BUILD ;; esac
SBIN=$ASAN_BUILD/isobatch
[ -x "$SBIN" ] || SBIN=$BIN
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_serve_XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
finish() { echo "t_serve: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit; }
command -v curl >/dev/null || { bad "curl not found (apt-get install curl)"; finish; }
[ -x "$BIN" ] || { bad "$BIN missing (run make)"; finish; }
"$BIN" mkmodel --preset tiny --seed 9 --out "$T/tiny" >/dev/null || { bad "mkmodel"; finish; }

# start NAME ARGS...: start a server, wait for its port file, set PORT; stops the test on failure
start() {
    local name=$1; shift
    rm -f "$T/$name.port"
    "$SBIN" serve -m "$T/tiny" --port 0 --port-file "$T/$name.port" --threads 2 "$@" 2> "$T/$name.log" &
    PIDS+=($!)
    LAST_PID=$!
    for _ in $(seq 1 100); do [ -s "$T/$name.port" ] && break; sleep 0.1; done
    [ -s "$T/$name.port" ] || { cat "$T/$name.log"; bad "$name: server did not start"; finish; }
    PORT=$(cat "$T/$name.port")
}
# stop PID NAME: SIGTERM, wait (bounded), exit 0, no sanitizer report
stop() {
    local pid=$1 name=$2 rc
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then bad "$name: did not stop within 10 s"; kill -KILL "$pid"; return; fi
    wait "$pid"; rc=$?
    [ $rc = 0 ] && ok || bad "$name: exit $rc"
    if grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$T/$name.log"; then bad "$name: sanitizer report"; head -40 "$T/$name.log"; else ok; fi
}
# req EXPECTED_CODE NAME CURL_ARGS...: body in $T/body, headers in $T/hdr
req() {
    local want=$1 name=$2; shift 2
    local code
    code=$(curl -s -m 30 -o "$T/body" -D "$T/hdr" -w '%{http_code}' "$@")
    if [ "$code" = "$want" ]; then ok; else bad "$name: HTTP $code, want $want: $(head -c 300 "$T/body")"; fi
}
# jget EXPR: evaluate a JS expression on the JSON body b
jget() { node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); console.log(eval(process.argv[2]))' "$T/body" "$1" 2>/dev/null; }
# err_is CODE NAME: the body is an OpenAI error with that code
err_is() {
    [ "$(jget 'b.error && typeof b.error.message === "string" && b.error.type ? b.error.code : "no error body"')" = "$1" ] \
        && ok || bad "$2: error body $(head -c 300 "$T/body")"
}

start main --api-key key-a --api-key key-b --max-batch 8 --max-prompt-tokens 1000 --max-tokens 200 --max-body 20000
U=http://127.0.0.1:$PORT
A=(-H "Authorization: Bearer key-a")
B=(-H "Authorization: Bearer key-b")
J=(-H "Content-Type: application/json")

req 200 healthz "$U/healthz"
req 200 models "${A[@]}" "$U/v1/models"
[ "$(jget 'b.data[0].id')" = tiny ] && ok || bad "models: id"
req 200 completion "${A[@]}" "${J[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello","max_tokens":8,"temperature":0,"logprobs":1}'
[ "$(jget 'b.choices[0].logprobs.token_ids.length + "," + b.usage.completion_tokens')" = "8,8" ] && ok || bad "completion: 8 tokens"
cp "$T/body" "$T/c8"
# top logprobs: greedy, so each token is its step's most likely one; alternatives in descending order
req 200 "completion top_logprobs" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello","max_tokens":8,"temperature":0,"logprobs":3}'
[ "$(jget 'const l=b.choices[0].logprobs; l.top_logprobs.every((m,i)=>{const v=Object.values(m); return v.length>=1&&v.length<=3&&v[0]===l.token_logprobs[i]&&v.every((x,j)=>j==0||x<=v[j-1])})')" = true ] \
    && ok || bad "completion top_logprobs: $(head -c 400 "$T/body")"
req 200 "chat top_logprobs" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":6,"temperature":0,"logprobs":true,"top_logprobs":4}'
[ "$(jget 'b.choices[0].logprobs.content.every(e=>e.top_logprobs.length===4&&e.top_logprobs[0].token_id===e.token_id&&e.top_logprobs[0].logprob===e.logprob&&e.top_logprobs.every((x,j,a)=>j==0||x.logprob<=a[j-1].logprob))')" = true ] \
    && ok || bad "chat top_logprobs: $(head -c 400 "$T/body")"
req 400 "top_logprobs without logprobs" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"top_logprobs":2}'
err_is invalid_value "top_logprobs without logprobs"
req 200 chat "${A[@]}" "${J[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":6}'
[ "$(jget 'b.object + "," + b.choices[0].message.role')" = "chat.completion,assistant" ] && ok || bad "chat: body"
curl -s -N -m 30 "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello","max_tokens":8,"temperature":0,"stream":true}' > "$T/sse"
[ "$(grep -c '^data: ' "$T/sse")" -ge 3 ] && [ "$(tail -2 "$T/sse" | head -1)" = "data: [DONE]" ] && ok || bad "SSE stream: $(head -c 300 "$T/sse")"

# errors
req 400 "malformed JSON" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny",'
err_is invalid_json "malformed JSON"
req 400 "wrong type" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":"8"}'
[ "$(jget 'b.error.param')" = max_tokens ] && ok || bad "wrong type: param"
req 400 "wrong type (temperature)" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"x"}],"temperature":"hot"}'
req 400 "messages not an array" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":"hi"}'
req 404 "unknown model" "${A[@]}" "$U/v1/completions" -d '{"model":"gpt-4","prompt":"x"}'
err_is model_not_found "unknown model"
head -c 30000 /dev/zero | tr '\0' a > "$T/big"
req 413 "oversized body" "${A[@]}" "$U/v1/completions" --data-binary @"$T/big"
err_is request_too_large "oversized body"
req 400 "prompt too long" "${A[@]}" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":\"$(head -c 2000 /dev/zero | tr '\0' b)\"}"
err_is context_length_exceeded "prompt too long"
req 400 "max_tokens over the limit" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":100000}'
req 401 "missing key" "$U/v1/models"
err_is invalid_api_key "missing key"
req 401 "wrong key" -H "Authorization: Bearer nope" "$U/v1/completions" -d '{"model":"tiny","prompt":"x"}'
req 404 "unknown endpoint" "${A[@]}" "$U/v1/embeddings" -d '{}'
req 405 "wrong method" "${A[@]}" "$U/v1/completions"

# stateful sessions
req 200 "session create" "${A[@]}" -X POST "$U/v1/sessions" -d '{"max_context":256}'
SID=$(jget b.id)
[[ "$SID" =~ ^sess_[0-9a-f]{32}$ ]] && ok || bad "session id '$SID' is not 128 random bits"
req 200 "session create 2" "${A[@]}" -X POST "$U/v1/sessions"
[ "$(jget b.id)" != "$SID" ] && ok || bad "session ids repeat"
SID2=$(jget b.id)
IDS=$(node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(JSON.stringify(b.choices[0].logprobs.token_ids))' "$T/c8")
req 200 "append tokens" "${A[@]}" "$U/v1/sessions/$SID/append" -d '{"tokens":[72,101,108,108,111]}'
[ "$(jget b.pending_tokens)" = 5 ] && ok || bad "append: pending"
req 200 "generate 4" "${A[@]}" "$U/v1/sessions/$SID/generate" -d '{"max_tokens":4,"temperature":0}'
T1=$(jget 'b.choices[0].text')
req 200 "info" "${A[@]}" "$U/v1/sessions/$SID"
[ "$(jget 'b.tokens_held + "," + b.kv_tokens + "," + (b.kv_bytes > 0)')" = "9,8,true" ] && ok || bad "info: $(cat "$T/body")"
curl -s -N -m 30 "${A[@]}" "$U/v1/sessions/$SID/generate" -d '{"max_tokens":4,"temperature":0,"stream":true}' > "$T/sse2"
T2=$(node -e 'let t="";for(const l of require("fs").readFileSync(process.argv[1],"utf8").split("\n")){if(!l.startsWith("data: {"))continue;t+=JSON.parse(l.slice(6)).choices[0].text}console.log(t)' "$T/sse2")
# "Hello" = bytes 72 101 108 108 111 (the tiny model's byte-level tokenizer): the same prompt as $T/c8
req 200 "completion by ids" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":[72,101,108,108,111],"max_tokens":8,"temperature":0}'
[ "$T1$T2" = "$(jget 'b.choices[0].text')" ] && ok || bad "session: 4 + 4 streamed tokens differ from one 8-token completion ('$T1$T2')"
req 404 "another tenant's session" "${B[@]}" "$U/v1/sessions/$SID"
err_is session_not_found "another tenant's session"
req 404 "another tenant's append" "${B[@]}" "$U/v1/sessions/$SID/append" -d '{"text":"x"}'
req 404 "unknown session" "${A[@]}" "$U/v1/sessions/sess_00000000000000000000000000000000"
req 400 "generate with nothing pending" "${A[@]}" "$U/v1/sessions/$SID2/generate" -d '{"max_tokens":4}'
req 200 "append chat messages" "${A[@]}" "$U/v1/sessions/$SID2/append" -d '{"messages":[{"role":"user","content":"hi"}]}'
req 200 "chat turn in a session" "${A[@]}" "$U/v1/sessions/$SID2/generate" -d '{"max_tokens":5,"chat":true}'
# windowed sessions (sink + window): fixed memory, positions past the window, same tokens alone and in a crowd
LONG=$(head -c 300 /dev/zero | tr '\0' q)
win_run() {
    req 200 "windowed session create" "${A[@]}" -X POST "$U/v1/sessions" -d '{"kv":"sink:4,window:32"}'
    local w; w=$(jget b.id)
    req 200 "windowed append" "${A[@]}" "$U/v1/sessions/$w/append" -d "{\"text\":\"$LONG\"}"
    req 200 "windowed generate" "${A[@]}" "$U/v1/sessions/$w/generate" -d '{"max_tokens":40,"temperature":0,"logprobs":1}'
    node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(JSON.stringify(b.choices[0].logprobs))' "$T/body" > "$T/win$1"
    req 200 "windowed info" "${A[@]}" "$U/v1/sessions/$w"
    [ "$(jget 'b.kv_bytes + "," + b.kv_policy + "," + b.tokens_held')" = "$(( (4 + 32 + 64) * 1024 )),sink:4,window:32,340" ] \
        && ok || bad "windowed info: $(cat "$T/body")"
    req 200 "windowed delete" "${A[@]}" -X DELETE "$U/v1/sessions/$w"
}
win_run 1
curl -s -N -m 30 "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"crowd","max_tokens":150,"stream":true}' > /dev/null &
C1=$!
curl -s -m 30 "${A[@]}" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":\"$LONG\",\"max_tokens\":60}" > /dev/null &
C2=$!
win_run 2
wait $C1 $C2
[ -s "$T/win1" ] && cmp -s "$T/win1" "$T/win2" && ok || bad "windowed session: tokens/logprobs differ alone and in a crowd"
req 400 "bad kv policy" "${A[@]}" -X POST "$U/v1/sessions" -d '{"kv":"window:0"}'
req 200 "delete" "${A[@]}" -X DELETE "$U/v1/sessions/$SID"
req 404 "get after delete" "${A[@]}" "$U/v1/sessions/$SID"
req 200 metrics "$U/metrics"
for m in isobatch_sessions isobatch_queue_length isobatch_batch_size isobatch_tokens_per_second isobatch_kv_bytes \
         'isobatch_step_seconds_bucket{le="+Inf"}' isobatch_step_seconds_count; do
    grep -qF "$m" "$T/body" && ok || bad "metrics lacks $m"
done
[ "$(grep '^isobatch_sessions ' "$T/body" | cut -d' ' -f2)" = 1 ] && ok || bad "metrics: sessions should be 1"

# the openai npm client, and invariance under load
CL=$ROOT/tests/openai_client
have_client() { (cd "$CL" && node -e 'require("openai")') 2>/dev/null; }
if ! have_client; then
    command -v npm >/dev/null || { bad "npm not found: cannot install the openai client (apt-get install npm)"; finish; }
    echo "installing the openai npm client (npm ci in tests/openai_client)"
    (cd "$CL" && timeout 300 npm ci --no-audit --no-fund --loglevel=error) > "$T/npm.log" 2>&1 \
        || { tail -5 "$T/npm.log"; bad "npm ci failed (is the npm registry reachable?): no client, no test"; finish; }
    have_client || { bad "the openai package is still missing after npm ci"; finish; }
fi
timeout 300 node "$CL/client_test.js" "$U" key-a tiny > "$T/client.out" 2>&1
n_ok=$(grep -c '^PASS ' "$T/client.out"); n_bad=$(grep -c '^FAIL ' "$T/client.out")
pass=$((pass + n_ok)); fail=$((fail + n_bad))
grep '^FAIL ' "$T/client.out"
[ "$n_ok" -ge 16 ] && ok || { bad "openai client: only $n_ok checks passed"; tail -5 "$T/client.out"; }
# the load generator runs against it (2 s, 4 clients, no errors)
node "$ROOT/bench/loadgen.js" --url "$U" --key key-a --model tiny --clients 4 --seconds 2 --max-tokens 16 --json > "$T/lg" 2>&1
[ "$(node -e 'const r=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(r.errors===0&&r.tokens>0&&r.ttft_ms_p50>0)' "$T/lg" 2>/dev/null)" = true ] \
    && ok || bad "loadgen: $(cat "$T/lg")"
stop "$LAST_PID" main

# the invariance checks must fail when the server batches wrongly. The fault only shows in a step that
# holds rows at different positions, so a 1 ms delay per generated token keeps the 31 other requests
# decoding while the checked ones run (with a fast model they could all be done before those arrive).
start faulty --inject rope-scalar-offset --max-batch 16 --token-delay-ms 1
timeout 300 node "$CL/client_test.js" "http://127.0.0.1:$PORT" none tiny > "$T/faulty.out" 2>&1
grep -q '^FAIL invariance under load: greedy' "$T/faulty.out" && ok || bad "invariance check passed under rope-scalar-offset"
stop "$LAST_PID" faulty

# over capacity: one generation at a time, no queue, a small memory budget; 20 ms per token, so the
# long stream (20 s) holds the only slot until the client goes away
start small --max-batch 1 --max-queue 0 --memory-budget 1200K --timeout 20 --token-delay-ms 20
U=http://127.0.0.1:$PORT
curl -s -N -m 20 "$U/v1/completions" -d '{"model":"tiny","prompt":"a long one","max_tokens":1000,"stream":true}' > /dev/null 2>&1 &
CURL=$!
for _ in $(seq 1 100); do curl -s "$U/metrics" | grep -q '^isobatch_jobs_active 1' && break; sleep 0.05; done
req 429 "over capacity" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":4}'
kill $CURL 2>/dev/null || bad "the long stream ended before the client could disconnect"; wait $CURL 2>/dev/null
grep -qi '^Retry-After: [0-9]' "$T/hdr" && ok || bad "429 without Retry-After"
err_is rate_limit_exceeded "over capacity"
# the client went away mid-stream: its slot and KV memory come back
freed=0
for _ in $(seq 1 50); do
    curl -s "$U/metrics" > "$T/m"
    if grep -q '^isobatch_jobs_active 0' "$T/m" && grep -q '^isobatch_kv_bytes 0' "$T/m"; then freed=1; break; fi
    sleep 0.1
done
[ $freed = 1 ] && ok || bad "disconnect did not free the generation: $(grep -E 'jobs_active|kv_bytes ' "$T/m")"
gen=$(grep '^isobatch_tokens_generated_total ' "$T/m" | cut -d' ' -f2)
[ -n "$gen" ] && [ "$gen" -lt 1000 ] && ok || bad "the disconnected stream was not cancelled ($gen tokens generated)"
req 200 "served after the disconnect" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":4}'
# a non-streaming client that gives up after 1 s: its generation is cancelled, not run to the end
curl -s -m 1 "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":1000}' > /dev/null 2>&1
freed=0
for _ in $(seq 1 50); do
    curl -s "$U/metrics" > "$T/m"
    grep -q '^isobatch_jobs_active 0' "$T/m" && { freed=1; break; }
    sleep 0.1
done
gen2=$(grep '^isobatch_tokens_generated_total ' "$T/m" | cut -d' ' -f2)
[ $freed = 1 ] && [ -n "$gen2" ] && [ $((gen2 - gen)) -lt 500 ] && ok \
    || bad "a non-streaming request kept running after its client left ($((gen2 - gen)) tokens)"
req 200 "served after the non-streaming disconnect" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":4}'
req 200 "session within the budget" -X POST "$U/v1/sessions" -d '{"max_context":700}'
req 429 "session over the memory budget" -X POST "$U/v1/sessions" -d '{"max_context":700}'
err_is memory_budget_exceeded "session over the memory budget"
stop "$LAST_PID" small

# queued requests outlive the idle timeout (1 s here): one slot at 50 ms/token, a 60-token stream
# holds it for 3 s while a streaming and a plain request wait; a client stalled mid-request is cut off
start queue --max-batch 1 --max-queue 4 --idle-timeout 1 --token-delay-ms 50 --kv-dtype f16
U=http://127.0.0.1:$PORT
# --kv-dtype f16: a session's KV takes half the bytes (tiny model: 512 per token instead of 1024)
req 200 "f16 session create" -X POST "$U/v1/sessions" -d '{"kv":"sink:4,window:32"}'
req 200 "f16 session info" "$U/v1/sessions/$(jget b.id)"
[ "$(jget 'b.kv_bytes')" = "$(( (4 + 32 + 64) * 512 ))" ] && ok || bad "f16 session info: $(cat "$T/body")"
curl -s -N -m 30 "$U/v1/completions" -d '{"model":"tiny","prompt":"a","max_tokens":60,"stream":true}' > "$T/q0" 2>&1 &
Q0=$!
for _ in $(seq 1 100); do curl -s "$U/metrics" | grep -q '^isobatch_jobs_active 1' && break; sleep 0.05; done
curl -s -N -m 30 "$U/v1/completions" -d '{"model":"tiny","prompt":"b","max_tokens":4,"stream":true}' > "$T/q1" 2>&1 &
Q1=$!
curl -s -m 30 -o "$T/q2" -w '%{http_code}' "$U/v1/completions" -d '{"model":"tiny","prompt":"c","max_tokens":4}' > "$T/q2code" 2>&1 &
Q2=$!
wait $Q0 $Q1 $Q2
for q in q0 q1; do tail -c 200 "$T/$q" | grep -q 'data: \[DONE\]' && ok || bad "queued stream $q cut off: $(tail -c 200 "$T/$q")"; done
[ "$(cat "$T/q2code")" = 200 ] && grep -q '"completion_tokens":4' "$T/q2" && ok || bad "queued plain request: $(cat "$T/q2code") $(head -c 200 "$T/q2")"
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{' >&3
timeout 10 cat <&3 > /dev/null; [ $? != 124 ] && ok || bad "a stalled request was not closed by the idle timeout"
exec 3<&-
stop "$LAST_PID" queue

# bad flags
"$BIN" serve -m "$T/tiny" --host not-an-ip --port 0 2> "$T/e" && bad "bad --host accepted" || { grep -q "not an IPv4 address" "$T/e" && ok || bad "bad --host: $(cat "$T/e")"; }
"$BIN" serve -m "$T/tiny" --memory-budget lots 2> "$T/e"; [ $? = 2 ] && ok || bad "bad --memory-budget"
finish

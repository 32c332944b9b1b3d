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
. "$(dirname "$0")/server_bins.sh"
. "$(dirname "$0")/server_checks.sh"   # stop, req (STOP_TIMEOUT_S 10)
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_serve_XXXXXX)
export ISOBATCH_DATA_DIR=$T/data  # the default store of a server started without --store
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
finish() { echo "t_serve: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit; }
command -v curl >/dev/null || { bad "curl not found (apt-get install curl)"; finish; }
[ -x "$BIN" ] || { bad "$BIN missing (run make)"; finish; }
"$BIN" mkmodel --preset tiny --seed 9 --out "$T/tiny" >/dev/null || { bad "mkmodel"; finish; }

# start NAME ARGS...: start a server, wait for its port file, set PORT; stops the test on failure
start() { local name=$1; shift; serve_start "$name" "$T/tiny" "$@"; }
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

# ---- what users touch: seeds, request fields, logit_bias, content parts, several prompts, new endpoints
# unseeded sampling draws a fresh seed and reports it; sending that seed back reproduces the answer
SAMP='"model":"tiny","prompt":"Hello","max_tokens":12,"temperature":1,"logprobs":1'
req 200 "unseeded 1" "${A[@]}" "$U/v1/completions" -d "{$SAMP}"; S1=$(jget b.seed); I1=$(jget 'JSON.stringify(b.choices[0].logprobs.token_ids)')
req 200 "unseeded 2" "${A[@]}" "$U/v1/completions" -d "{$SAMP}"; S2=$(jget b.seed); I2=$(jget 'JSON.stringify(b.choices[0].logprobs.token_ids)')
[[ "$S1" =~ ^[0-9]+$ ]] && [[ "$S2" =~ ^[0-9]+$ ]] && [ "$S1" != "$S2" ] && ok || bad "unseeded requests: seeds '$S1' '$S2' (want two different reported seeds)"
[ "$I1" != "$I2" ] && ok || bad "two unseeded temperature-1 requests gave the same tokens $I1"
req 200 "replay the reported seed" "${A[@]}" "$U/v1/completions" -d "{$SAMP,\"seed\":$S1}"
[ "$(jget b.seed)" = "$S1" ] && [ "$(jget 'JSON.stringify(b.choices[0].logprobs.token_ids)')" = "$I1" ] && ok || bad "seed $S1 did not reproduce $I1"
# fields: unknown ones and unimplemented ones are a 400 naming the field; their "off" values are accepted
CH='"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4'
field_400() { # NAME CODE PARAM URL BODY
    req 400 "$1" "${A[@]}" "$U$4" -d "$5"
    [ "$(jget 'b.error.code + " " + b.error.param')" = "$2 $3" ] && ok || bad "$1: want $2 naming $3: $(head -c 300 "$T/body")"
}
field_400 "unknown field" unknown_parameter frobnicate /v1/completions '{"model":"tiny","prompt":"x","frobnicate":1}'
field_400 "tools" unsupported_parameter tools /v1/chat/completions "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}"
field_400 "tool_choice without tools" invalid_value tool_choice /v1/chat/completions "{$CH,\"tool_choice\":\"auto\"}"
# response_format json_object: decoding constrained to one JSON object
req 200 "response_format json_object" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":200,"temperature":0.9,"seed":4,"response_format":{"type":"json_object"}}'
[ "$(jget 'const c=b.choices[0]; const t=c.message.content.trimStart(); t[0]==="{" && (c.finish_reason!=="stop" || (typeof JSON.parse(t)==="object" && !Array.isArray(JSON.parse(t))))')" = true ] \
    && ok || bad "json_object: not a JSON object (prefix): $(head -c 400 "$T/body")"
# steered to completion: '}' (id 125) strongly favoured, so the object closes at once and the turn ends
req 200 "json_object completes" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":40,"temperature":0,"logit_bias":{"125":100},"response_format":{"type":"json_object"}}'
[ "$(jget 'const c=b.choices[0]; c.finish_reason + "," + JSON.stringify(JSON.parse(c.message.content))')" = "stop,{}" ] \
    && ok || bad "json_object did not complete as {}: $(head -c 400 "$T/body")"
# without the constraint the same request does not give an object
req 200 "no json mode" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":40,"temperature":0,"logit_bias":{"125":100}}'
[ "$(jget 'b.choices[0].message.content.startsWith("}")')" = true ] && ok || bad "the json_object check cannot fail: $(head -c 200 "$T/body")"
# response_format json_schema: constrained to the schema; a stopped reply parses and satisfies it
SCH='{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer"},"c":{"enum":["red","green",7]},"l":{"type":"array","items":{"type":"null"},"maxItems":2}},"required":["ok","n","c"],"additionalProperties":false}'
# (whitespace ids 9, 10, 13, 32 made less likely: the random model would spend most tokens on it)
SREQ='"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":200,"temperature":0.9,"logprobs":true,"logit_bias":{"9":-3,"10":-3,"13":-3,"32":-3}'
sstops=0
for seed in 1 2 3 4 5 6; do
    req 200 "json_schema seed $seed" "${A[@]}" "$U/v1/chat/completions" -d "{$SREQ,\"seed\":$seed,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$SCH}}}"
    cp "$T/body" "$T/schema$seed"
    v=$(jget 'const c=b.choices[0]; if (c.finish_reason!=="stop") "length"; else { const o=JSON.parse(c.message.content); const k=Object.keys(o); (typeof o.ok==="boolean" && Number.isInteger(o.n) && ["red","green",7].includes(o.c) && k.every(x=>["ok","n","c","l"].includes(x)) && (o.l===undefined || (Array.isArray(o.l) && o.l.length<=2 && o.l.every(x=>x===null)))) ? "valid" : "INVALID" }')
    case $v in valid) ok; sstops=$((sstops+1)) ;; length) ;; *) bad "json_schema seed $seed: not valid ($v): $(head -c 400 "$T/body")" ;; esac
done
[ "$sstops" -ge 3 ] && ok || bad "json_schema: only $sstops of 6 replies completed"
# batched vs alone: the same six requests at once give the same bytes (content, ids, logprobs)
CPIDS=()
for seed in 1 2 3 4 5 6; do
    curl -s -m 60 "${A[@]}" "$U/v1/chat/completions" -d "{$SREQ,\"seed\":$seed,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$SCH}}}" > "$T/schema_b$seed" &
    CPIDS+=($!)
done
wait "${CPIDS[@]}"
same=0
for seed in 1 2 3 4 5 6; do
    a=$(node -e 'const c=JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0]; console.log(JSON.stringify([c.message.content,c.finish_reason,c.logprobs.content.map(e=>[e.token_id,e.logprob])]))' "$T/schema$seed")
    b=$(node -e 'const c=JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0]; console.log(JSON.stringify([c.message.content,c.finish_reason,c.logprobs.content.map(e=>[e.token_id,e.logprob])]))' "$T/schema_b$seed")
    [ -n "$a" ] && [ "$a" = "$b" ] && same=$((same+1))
done
[ $same = 6 ] && ok || bad "json_schema: $same of 6 batched replies equal to the same request alone"
# the validity check can fail: without the constraint the same request is not such an object
req 200 "no json_schema" "${A[@]}" "$U/v1/chat/completions" -d "{$SREQ,\"seed\":1}"
[ "$(jget 'try { const o=JSON.parse(b.choices[0].message.content); typeof o.ok==="boolean" } catch (e) { false }')" = false ] && ok || bad "the json_schema check cannot fail"
# refused schemas: a one-line 400 naming the keyword or the value
field_400 "json_schema: unsupported keyword" unsupported_parameter response_format /v1/chat/completions "{$CH,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0}}}}}}"
[ "$(jget 'b.error.message')" = "response_format.json_schema.schema.properties.a: keyword 'minimum' is not supported (supported: type, properties, required, additionalProperties, items, minItems, maxItems, enum, const, anyOf, \$ref, \$defs)" ] && ok || bad "json_schema keyword message: $(head -c 400 "$T/body")"
field_400 "json_schema: \$ref to nothing" invalid_value response_format /v1/chat/completions "{$CH,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"\$ref\":\"#/\$defs/nope\"}}}}"
field_400 "json_schema: no name" invalid_value response_format /v1/chat/completions "{$CH,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{}}}}"
field_400 "json_schema: schema not an object" invalid_value response_format /v1/chat/completions "{$CH,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":[]}}}"
field_400 "response_format: unknown type" invalid_value response_format /v1/chat/completions "{$CH,\"response_format\":{\"type\":\"yaml\"}}"
field_400 "echo not a boolean" invalid_value echo /v1/completions '{"model":"tiny","prompt":"x","echo":1}'
field_400 "echo on chat" unknown_parameter echo /v1/chat/completions "{$CH,\"echo\":true}"
field_400 "suffix" unsupported_parameter suffix /v1/completions '{"model":"tiny","prompt":"x","suffix":"end"}'
field_400 "best_of" unsupported_parameter best_of /v1/completions '{"model":"tiny","prompt":"x","best_of":3}'
field_400 "frequency_penalty" unsupported_parameter frequency_penalty /v1/completions '{"model":"tiny","prompt":"x","frequency_penalty":0.5}'
field_400 "tools on completions" unknown_parameter tools /v1/completions '{"model":"tiny","prompt":"x","tools":[]}'
req 200 "off values accepted" "${A[@]}" "$U/v1/chat/completions" -d "{$CH,\"tools\":[],\"tool_choice\":\"none\",\"response_format\":{\"type\":\"text\"},\"presence_penalty\":0,\"user\":\"u1\"}"
req 200 "echo false, best_of 1" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"x","max_tokens":2,"echo":false,"best_of":1}'
field_400 "max_tokens 0" invalid_value max_tokens /v1/completions '{"model":"tiny","prompt":"x","max_tokens":0}'
field_400 "max_completion_tokens 0" invalid_value max_completion_tokens /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}'
# echo: the prompt comes back before the completion, with its tokens' logprobs (the first null)
req 200 "echo, max_tokens 0" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello wor","max_tokens":0,"echo":true,"logprobs":1}'
[ "$(jget '[b.choices[0].text, b.choices[0].finish_reason, b.usage.completion_tokens, b.choices[0].logprobs.tokens.join(""), b.choices[0].logprobs.text_offset.join(","), b.choices[0].logprobs.token_logprobs[0], b.choices[0].logprobs.top_logprobs[0], b.choices[0].logprobs.token_logprobs.slice(1).every(x => x < 0), Object.keys(b.choices[0].logprobs.top_logprobs[1]).length].join("|")')" \
    = "Hello wor|length|0|Hello wor|0,1,2,3,4,5,6,7,8|||true|1" ] && ok || bad "echo with max_tokens 0: $(head -c 600 "$T/body")"
# streamed, the prompt's chunk comes first: the chunks joined are the body of the same request unstreamed
EB='"model":"tiny","prompt":"Hello wor","max_tokens":8,"echo":true,"logprobs":2,"temperature":0'
req 200 "echo, unstreamed" "${A[@]}" "$U/v1/completions" -d "{$EB}"
cp "$T/body" "$T/echo1"
curl -s -N -m 30 "${A[@]}" "$U/v1/completions" -d "{$EB,\"stream\":true}" > "$T/echo2"
[ "$(node -e '
const fs=require("fs"), one=JSON.parse(fs.readFileSync(process.argv[1])).choices[0];
const ch=fs.readFileSync(process.argv[2],"utf8").split("\n").filter(l => l.startsWith("data: {")).map(l => JSON.parse(l.slice(6)).choices[0]);
const j={text:"", tokens:[], token_logprobs:[], top_logprobs:[], text_offset:[], token_ids:[]};
for (const c of ch) { j.text += c.text; if (c.logprobs) for (const k of Object.keys(c.logprobs)) j[k] = j[k].concat(c.logprobs[k]); }
const want={text:one.text, ...one.logprobs};
console.log(ch[0].text === "Hello wor" && ch[0].logprobs.token_logprobs[0] === null && JSON.stringify(j) === JSON.stringify(want));' "$T/echo1" "$T/echo2" 2>&1)" = true ] \
    && ok || bad "streamed echo differs from unstreamed: $(head -c 400 "$T/echo2")"
req 200 "echo without logprobs" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello","max_tokens":3,"echo":true,"temperature":0}'
[ "$(jget 'b.choices[0].text.startsWith("Hello") && b.choices[0].text.length > 5 && b.choices[0].logprobs === null')" = true ] && ok || bad "echo without logprobs: $(head -c 300 "$T/body")"
# echo_score: a greedy completion (echoed, logprobs 2), then its own tokens sent back as a prompt to
# score (echo, max_tokens 0): every token's logprob and alternatives must be the same numbers — the
# completion's tokens came from one-row decode steps, the scoring from one prompt's rows in chunks.
# Prints "equal N" or "differ: ..."
echo_score() {
    curl -s -m 60 -o "$T/es1" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"The quick brown fox jumps over","max_tokens":40,"temperature":0,"echo":true,"logprobs":2}'
    local ids
    ids=$(node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(JSON.stringify(b.choices[0].logprobs.token_ids))' "$T/es1" 2>/dev/null)
    curl -s -m 60 -o "$T/es2" "${A[@]}" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":$ids,\"max_tokens\":0,\"echo\":true,\"logprobs\":2}"
    node -e '
const fs=require("fs"), a=JSON.parse(fs.readFileSync(process.argv[1])).choices[0], b=JSON.parse(fs.readFileSync(process.argv[2])).choices[0];
const A=a.logprobs, B=b.logprobs, n=A.token_ids.length;
const same = a.text === b.text && n === B.token_ids.length && n > 40 &&
  JSON.stringify([A.token_ids, A.token_logprobs, A.top_logprobs, A.text_offset]) === JSON.stringify([B.token_ids, B.token_logprobs, B.top_logprobs, B.text_offset]);
let first = -1; for (let i = 0; i < n && first < 0; i++) if (A.token_logprobs[i] !== B.token_logprobs[i]) first = i;
console.log(same ? "equal " + n : "differ: " + n + " tokens, first logprob difference at " + first);' "$T/es1" "$T/es2" 2>&1
}
r=$(echo_score)
case $r in "equal "*) ok ;; *) bad "a completion scored again as an echoed prompt: $r" ;; esac
# top_k -1 is "off", the same as top_k 0
req 200 "top_k -1" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello","max_tokens":8,"temperature":1,"seed":5,"top_k":-1}'
K1=$(jget 'b.choices[0].text')
req 200 "top_k 0" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello","max_tokens":8,"temperature":1,"seed":5,"top_k":0}'
[ "$K1" = "$(jget 'b.choices[0].text')" ] && ok || bad "top_k -1 differs from top_k 0"
field_400 "top_k -2" invalid_value top_k /v1/completions '{"model":"tiny","prompt":"x","top_k":-2}'
# logit_bias: +100 on one id makes greedy pick it; -100 on the greedy first token bans it; logprobs stay raw
req 200 "logit_bias +100" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello","max_tokens":6,"temperature":0,"logprobs":1,"logit_bias":{"65":100}}'
[ "$(jget 'b.choices[0].logprobs.token_ids.join(",")')" = "65,65,65,65,65,65" ] && ok || bad "logit_bias +100: $(head -c 300 "$T/body")"
FIRST=$(node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(b.choices[0].logprobs.token_ids[0])' "$T/c8")
req 200 "logit_bias -100" "${A[@]}" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":\"Hello\",\"max_tokens\":1,\"temperature\":0,\"logprobs\":1,\"logit_bias\":{\"$FIRST\":-100}}"
[ "$(jget 'b.choices[0].logprobs.token_ids[0]')" != "$FIRST" ] && ok || bad "logit_bias -100 did not ban token $FIRST"
field_400 "logit_bias bad id" invalid_value logit_bias /v1/completions '{"model":"tiny","prompt":"x","logit_bias":{"999999":1}}'
field_400 "logit_bias bad value" invalid_value logit_bias /v1/completions '{"model":"tiny","prompt":"x","logit_bias":{"5":101}}'
# content as an array of text parts = the same content as one string
req 200 "content parts" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"hel"},{"type":"text","text":"lo"}]}],"max_tokens":6,"temperature":0}'
P1=$(jget 'b.choices[0].message.content + "|" + b.usage.prompt_tokens')
req 200 "content string" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hello"}],"max_tokens":6,"temperature":0}'
[ "$P1" = "$(jget 'b.choices[0].message.content + "|" + b.usage.prompt_tokens')" ] && ok || bad "content parts differ from the joined string"
field_400 "image part" invalid_value messages /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}'
grep -q "image_url" "$T/body" && ok || bad "image part: the message does not name the part type"
field_400 "part type with a newline" invalid_value messages /v1/chat/completions '{"model":"tiny","messages":[{"role":"user","content":[{"type":"a\nb","text":"x"}]}]}'
node -e 'const m = JSON.parse(require("fs").readFileSync(process.argv[1])).error.message; process.exit(m.includes("part type '"'"'a b'"'"'") && !/[\r\n]/.test(m) ? 0 : 1)' "$T/body" && ok || bad "part type with a newline: the message is not one printable line: $(cat "$T/body")"
# several prompts: one choice per prompt, each equal to that prompt alone; usage adds up
req 200 "two prompts" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":["Hello","crowd"],"max_tokens":8,"temperature":0}'
cp "$T/body" "$T/multi"
req 200 "prompt crowd alone" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"crowd","max_tokens":8,"temperature":0}'
CROWD=$(jget 'b.choices[0].text')
HELLO=$(node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1]));console.log(b.choices[0].text)' "$T/c8")
cp "$T/multi" "$T/body"
[ "$(jget 'b.choices.length + "," + b.choices[0].index + "," + b.choices[1].index + "," + b.usage.completion_tokens')" = "2,0,1,16" ] \
    && [ "$(jget 'b.choices[0].text')" = "$HELLO" ] && [ "$(jget 'b.choices[1].text')" = "$CROWD" ] && ok || bad "two prompts: $(head -c 400 "$T/body")"
req 200 "two token-id prompts" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":[[72,101,108,108,111],[99,114,111,119,100]],"max_tokens":8,"temperature":0}'
[ "$(jget 'b.choices[0].text')" = "$HELLO" ] && [ "$(jget 'b.choices[1].text')" = "$CROWD" ] && ok || bad "token-id prompts: $(head -c 400 "$T/body")"
field_400 "mixed prompt list" invalid_value prompt /v1/completions '{"model":"tiny","prompt":["a",[1,2]]}'
# n choices: choice j is what the same request with n 1 and seed + j gets (token ids, logprobs, finish
# reason: bitwise), all n decoded in one batch; several prompts x n: choice i * n + j is prompt i's j-th;
# usage adds up (a prompt counted once); a choice's record verifies; n > 1 streamed, n 0, n 129 and n
# over what the server runs or queues are 400s naming the field
# same_choice BODY K SINGLE: choice K of BODY (file) equals choice 0 of SINGLE but for its index
same_choice() {
    node -e 'const fs=require("fs"), a=JSON.parse(fs.readFileSync(process.argv[1])).choices[+process.argv[2]], b=JSON.parse(fs.readFileSync(process.argv[3])).choices[0];
delete a.index; delete b.index; delete a.verification; delete b.verification; process.exit(JSON.stringify(a)===JSON.stringify(b) && a.logprobs ? 0 : 1)' "$1" "$2" "$3"
}
shared_total() { curl -s "$U/metrics" | sed -n 's/^isobatch_tokens_shared_total //p'; }
SH0=$(shared_total)
req 200 "n 3" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello there","max_tokens":12,"n":3,"seed":11,"logprobs":2}'
cp "$T/body" "$T/n3"
# choices 1 and 2 copy choice 0's session after its first 10 of the 11 prompt tokens
[ -n "$SH0" ] && [ "$(shared_total)" = $((SH0 + 20)) ] && ok || bad "n 3: tokens shared $SH0 -> $(shared_total), want +20"
[ "$(jget 'b.choices.map(c=>c.index).join(",") + " " + b.usage.prompt_tokens + " " + (b.usage.completion_tokens === b.choices.reduce((s,c)=>s+c.logprobs.token_ids.length,0))')" = "0,1,2 11 true" ] \
    && ok || bad "n 3: indexes and usage: $(head -c 300 "$T/body")"
[ "$(jget 'new Set(b.choices.map(c=>c.text)).size')" -ge 2 ] && ok || bad "n 3: the choices are all the same text"
for j in 0 1 2; do
    req 200 "n 1, seed 11 + $j" "${A[@]}" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":\"Hello there\",\"max_tokens\":12,\"seed\":$((11 + j)),\"logprobs\":2}"
    same_choice "$T/n3" $j "$T/body" && ok || bad "n 3: choice $j differs from the request with seed $((11 + j)): $(head -c 300 "$T/body")"
done
node -e 'console.log(JSON.stringify(JSON.parse(require("fs").readFileSync(process.argv[1])).choices[2].verification))' "$T/n3" > "$T/n3.rec"
req 200 "n 3: choice 2's record" "${A[@]}" "$U/v1/verify" -d @"$T/n3.rec"
[ "$(jget 'b.match')" = true ] && ok || bad "n 3: choice 2's record does not verify: $(head -c 300 "$T/body")"
CHN='"model":"tiny","messages":[{"role":"user","content":"hi"}]'
req 200 "chat n 2" "${A[@]}" "$U/v1/chat/completions" -d "{$CHN,\"max_tokens\":10,\"n\":2,\"seed\":4,\"logprobs\":true}"
cp "$T/body" "$T/cn2"
[ "$(jget 'b.object + " " + b.choices.length')" = "chat.completion 2" ] && ok || bad "chat n 2: $(head -c 300 "$T/body")"
for j in 0 1; do
    req 200 "chat n 1, seed 4 + $j" "${A[@]}" "$U/v1/chat/completions" -d "{$CHN,\"max_tokens\":10,\"seed\":$((4 + j)),\"logprobs\":true}"
    same_choice "$T/cn2" $j "$T/body" && ok || bad "chat n 2: choice $j differs from the request with seed $((4 + j))"
done
req 200 "two prompts x n 2" "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":["Hello","crowd"],"max_tokens":6,"n":2,"seed":21,"logprobs":1}'
cp "$T/body" "$T/p2n2"
[ "$(jget 'b.choices.length + " " + b.usage.prompt_tokens')" = "4 10" ] && ok || bad "two prompts x n 2: $(head -c 300 "$T/body")"
for k in 0 1 2 3; do
    pr=$([ $k -lt 2 ] && echo Hello || echo crowd)
    req 200 "prompt $pr, seed $((21 + k % 2))" "${A[@]}" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":\"$pr\",\"max_tokens\":6,\"seed\":$((21 + k % 2)),\"logprobs\":1}"
    same_choice "$T/p2n2" $k "$T/body" && ok || bad "two prompts x n 2: choice $k differs from prompt $pr with seed $((21 + k % 2))"
done
# streamed n (and several prompts): every chunk of one response shares its id and seed, each choice's
# deltas joined are the body's choice (text or content, token ids, logprobs, finish reason), one usage
# chunk (include_usage) equal to the body's, then [DONE]
# sse_choices SSE_FILE BODY_FILE CHAT: "same" or what differs
sse_choices() {
    node -e 'const fs=require("fs"), chat=process.argv[3]==="1";
const ev=fs.readFileSync(process.argv[1],"utf8").split("\n\n").filter(x=>x.startsWith("data: ")).map(x=>x.slice(6));
const body=JSON.parse(fs.readFileSync(process.argv[2]));
if (ev[ev.length-1]!=="[DONE]") { console.log("no [DONE] last"); process.exit(); }
const cs=ev.slice(0,-1).map(x=>JSON.parse(x)), ids=new Set(cs.map(c=>c.id)), seeds=new Set(cs.map(c=>c.seed));
if (ids.size!==1 || seeds.size!==1 || [...seeds][0]!==body.seed) { console.log("ids/seeds " + [...ids] + " / " + [...seeds]); process.exit(); }
const got={};
let usage=null;
for (const c of cs) {
  if (c.usage) usage=c.usage;
  for (const ch of c.choices) {
    const g=got[ch.index]=got[ch.index]||{text:"",ids:[],lp:[],finish:null,ver:0};
    g.text+=chat ? (ch.delta.content||"") : ch.text;
    if (ch.logprobs) { if (chat) ch.logprobs.content.forEach(e=>{g.ids.push(e.token_id); g.lp.push(e.logprob);}); else { g.ids.push(...ch.logprobs.token_ids); g.lp.push(...ch.logprobs.token_logprobs); } }
    if (ch.finish_reason) { g.finish=ch.finish_reason; g.ver=c.verification ? 1 : 0; }
  }
}
const bad=[];
body.choices.forEach((b,k)=>{ const g=got[k]; if (!g) { bad.push("choice "+k+" missing"); return; }
  const ids=chat ? b.logprobs.content.map(e=>e.token_id) : b.logprobs.token_ids, lp=chat ? b.logprobs.content.map(e=>e.logprob) : b.logprobs.token_logprobs;
  const text=chat ? b.message.content : b.text;
  if (g.text!==text || JSON.stringify(g.ids)!==JSON.stringify(ids) || JSON.stringify(g.lp)!==JSON.stringify(lp) || g.finish!==b.finish_reason || !g.ver) bad.push("choice "+k); });
if (Object.keys(got).length!==body.choices.length) bad.push(Object.keys(got).length+" indexes streamed");
if (JSON.stringify(usage)!==JSON.stringify(body.usage)) bad.push("usage "+JSON.stringify(usage));
console.log(bad.length ? bad.join(", ") : "same");' "$1" "$2" "$3"
}
NS='"model":"tiny","prompt":"Hello there","max_tokens":12,"n":3,"seed":11,"logprobs":2'
curl -s -N -m 30 "${A[@]}" "$U/v1/completions" -d "{$NS,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" > "$T/n3sse"
req 200 "n 3 body again" "${A[@]}" "$U/v1/completions" -d "{$NS}"
v=$(sse_choices "$T/n3sse" "$T/body" 0); [ "$v" = same ] && ok || bad "n 3 streamed differs from its body: $v"
curl -s -N -m 30 "${A[@]}" "$U/v1/chat/completions" -d "{$CHN,\"max_tokens\":10,\"n\":2,\"seed\":4,\"logprobs\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" > "$T/cn2sse"
v=$(sse_choices "$T/cn2sse" "$T/cn2" 1); [ "$v" = same ] && ok || bad "chat n 2 streamed differs from its body: $v"
curl -s -N -m 30 "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":["Hello","crowd"],"max_tokens":6,"n":2,"seed":21,"logprobs":1,"stream":true,"stream_options":{"include_usage":true}}' > "$T/p2n2sse"
v=$(sse_choices "$T/p2n2sse" "$T/p2n2" 0); [ "$v" = same ] && ok || bad "two prompts x n 2 streamed differs from its body: $v"
# the check can fail: a stream of other seeds is not that body
curl -s -N -m 30 "${A[@]}" "$U/v1/completions" -d '{"model":"tiny","prompt":"Hello there","max_tokens":12,"n":3,"seed":12,"logprobs":2,"stream":true,"stream_options":{"include_usage":true}}' > "$T/n3sse12"
v=$(sse_choices "$T/n3sse12" "$T/n3" 0); [ "$v" != same ] && ok || bad "the streamed-n check cannot fail"
field_400 "n 0" invalid_value n /v1/completions '{"model":"tiny","prompt":"a","n":0}'
field_400 "n 129" invalid_value n /v1/chat/completions "{$CH,\"n\":129}"
field_400 "n over what the server runs or queues" invalid_value n /v1/completions '{"model":"tiny","prompt":"a","n":128}'
# models/{id}, /health, OPTIONS and Allow, request ids and the request log
req 200 "GET /v1/models/{id}" "${A[@]}" "$U/v1/models/tiny"
[ "$(jget 'b.id + "," + b.object')" = "tiny,model" ] && ok || bad "models/{id}: $(cat "$T/body")"
req 404 "GET /v1/models/{unknown}" "${A[@]}" "$U/v1/models/gpt-4"
err_is model_not_found "GET /v1/models/{unknown}"
req 401 "GET /v1/models/{id} without a key" "$U/v1/models/tiny"
req 200 "/health" "$U/health"
req 204 "OPTIONS preflight" -X OPTIONS -H "Origin: http://example.test" -H "Access-Control-Request-Method: POST" "$U/v1/chat/completions"
grep -qi '^Allow: POST, OPTIONS' "$T/hdr" && grep -qi '^Access-Control-Allow-Origin: \*' "$T/hdr" && grep -qi '^Access-Control-Allow-Headers: .*Authorization' "$T/hdr" \
    && ok || bad "OPTIONS: headers $(tr -d '\r' < "$T/hdr" | tr '\n' '|')"
req 405 "405 carries Allow" "${A[@]}" -X PUT "$U/v1/completions"
grep -qi '^Allow: POST, OPTIONS' "$T/hdr" && ok || bad "405 without Allow: $(tr -d '\r' < "$T/hdr" | tr '\n' '|')"
req 200 "request id made" "$U/healthz"
grep -qiE '^X-Request-Id: [0-9a-f]{16}' "$T/hdr" && ok || bad "no X-Request-Id header"
req 200 "request id echoed" -H "X-Request-Id: trace-42-abc" "$U/healthz"
grep -qi '^X-Request-Id: trace-42-abc' "$T/hdr" && ok || bad "X-Request-Id not echoed"
sleep 0.2
grep -qE '^isobatch serve: [0-9T:-]+Z trace-42-abc GET /healthz 200 [0-9.]+ ms$' "$T/main.log" && ok || bad "request log line missing: $(tail -3 "$T/main.log")"
# /tokenize and /detokenize
req 200 "/tokenize" "${A[@]}" "$U/tokenize" -d '{"content":"Hello"}'
[ "$(jget 'b.tokens.join(",") + "|" + b.count')" = "72,101,108,108,111|5" ] && ok || bad "/tokenize: $(cat "$T/body")"
req 200 "/tokenize with pieces" "${A[@]}" "$U/tokenize" -d '{"prompt":"Hi","with_pieces":true}'
[ "$(jget 'b.tokens.map(t=>t.id+":"+t.piece).join(",")')" = "72:H,105:i" ] && ok || bad "/tokenize pieces: $(cat "$T/body")"
req 200 "chat prompt size" "${A[@]}" "$U/v1/chat/completions" -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":1}'
NCHAT=$(jget b.usage.prompt_tokens)
req 200 "/tokenize messages" "${A[@]}" "$U/tokenize" -d '{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}'
[ "$(jget b.count)" = "$NCHAT" ] && ok || bad "/tokenize messages: count $(jget b.count), want the chat prompt's $NCHAT"
req 200 "/detokenize" "${A[@]}" "$U/detokenize" -d '{"tokens":[72,101,108,108,111]}'
[ "$(jget b.content)" = Hello ] && ok || bad "/detokenize: $(cat "$T/body")"
field_400 "/tokenize unknown field" invalid_value text /tokenize '{"text":"x"}'
field_400 "/detokenize bad id" invalid_value tokens /detokenize '{"tokens":[-1]}'
field_400 "prompt token id out of range" invalid_value prompt /v1/completions '{"model":"tiny","prompt":[1,999999]}'
field_400 "prompt list: a token id not an integer" invalid_value prompt /v1/completions '{"model":"tiny","prompt":[[1,2],[3,"x"]]}'
req 401 "/tokenize without a key" "$U/tokenize" -d '{"content":"x"}'
req 405 "/tokenize GET" "${A[@]}" "$U/tokenize"
# latency histograms, and a tokens/s gauge that scrapes do not reset
sleep 1.1
# the gauge covers the last 10 whole seconds of the server's own clock (counted from its start, so
# its second boundaries are not the wall clock's): two back-to-back scrapes agree unless a boundary
# falls between them, so the pair is taken again when they differ; a scrape that reset the gauge
# makes the second of a pair smaller, or both 0 once nothing is generated, which fails below
for _ in 1 2 3 4 5 6; do
    curl -s "$U/metrics" > "$T/m1"; curl -s "$U/metrics" > "$T/m2"
    [ "$(grep '^isobatch_tokens_per_second ' "$T/m1")" = "$(grep '^isobatch_tokens_per_second ' "$T/m2")" ] && break
done
for m in isobatch_time_to_first_token_seconds isobatch_inter_token_seconds isobatch_queue_seconds; do
    c=$(grep "^${m}_count " "$T/m1" | cut -d' ' -f2)
    [ -n "$c" ] && [ "$c" -gt 0 ] && grep -q "^${m}_bucket{le=\"+Inf\"} $c\$" "$T/m1" && ok || bad "metrics: $m histogram (count '$c')"
done
R1=$(grep '^isobatch_tokens_per_second ' "$T/m1" | cut -d' ' -f2); R2=$(grep '^isobatch_tokens_per_second ' "$T/m2" | cut -d' ' -f2)
[ -n "$R1" ] && [ "$R1" = "$R2" ] && [ "$(node -e "console.log($R1 > 0)")" = true ] && ok || bad "tokens/s gauge reset by a scrape: $R1 then $R2"

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
req 400 "unknown field in a session generate" "${A[@]}" "$U/v1/sessions/$SID2/generate" -d '{"max_tokens":4,"nope":1}'
[ "$(jget 'b.error.code + " " + b.error.param')" = "unknown_parameter nope" ] && ok || bad "session generate: unknown field: $(cat "$T/body")"
# session create and append take their own fields only, each naming what is wrong
# sfield_400 NAME CODE PARAM URL BODY
sfield_400() {
    req 400 "$1" "${A[@]}" "$4" -d "$5"
    [ "$(jget 'b.error.code + " " + b.error.param')" = "$2 $3" ] && ok || bad "$1: want $2 naming $3: $(head -c 300 "$T/body")"
}
sfield_400 "unknown field in a session create" unknown_parameter frobnicate "$U/v1/sessions" '{"max_context":64,"frobnicate":1}'
sfield_400 "unknown field in an append" unknown_parameter nope "$U/v1/sessions/$SID2/append" '{"text":"x","nope":1}'
sfield_400 "append of text and tokens" invalid_value tokens "$U/v1/sessions/$SID2/append" '{"text":"x","tokens":[1]}'
sfield_400 "append of tokens and messages" invalid_value messages "$U/v1/sessions/$SID2/append" '{"tokens":[1],"messages":[{"role":"user","content":"x"}]}'
sfield_400 "add_special without text" invalid_value add_special "$U/v1/sessions/$SID2/append" '{"tokens":[1],"add_special":true}'
sfield_400 "add_generation_prompt without messages" invalid_value add_generation_prompt "$U/v1/sessions/$SID2/append" '{"text":"x","add_generation_prompt":false}'
req 400 "generate with nothing pending" "${A[@]}" "$U/v1/sessions/$SID2/generate" -d '{"max_tokens":4}'
# a session of the client's id, POST /v1/sessions/{id} (a balancer hashing the path sends its creation
# to the replica that will serve it): a taken id is a 409 whoever holds it, a bad id a 400; deleted,
# the id can be taken again
req 200 "session of a chosen id" "${A[@]}" -X POST "$U/v1/sessions/chat-42.a_B"
[ "$(jget 'b.id + " " + b.object')" = "chat-42.a_B session" ] && ok || bad "session of a chosen id: $(head -c 300 "$T/body")"
req 200 "session of a chosen id, with a body" "${A[@]}" "$U/v1/sessions/c2" -d '{"max_context":64}'
[ "$(jget 'b.id + " " + b.max_context')" = "c2 64" ] && ok || bad "session of a chosen id with a body: $(head -c 300 "$T/body")"
req 200 "append to it" "${A[@]}" "$U/v1/sessions/chat-42.a_B/append" -d '{"tokens":[72,101]}'
req 409 "the same id again" "${A[@]}" -X POST "$U/v1/sessions/chat-42.a_B"
err_is session_exists "the same id again"
req 409 "the same id, another key" "${B[@]}" -X POST "$U/v1/sessions/chat-42.a_B"
req 404 "another key's session of a chosen id" "${B[@]}" "$U/v1/sessions/chat-42.a_B"
req 400 "a bad id" "${A[@]}" -X POST "$U/v1/sessions/bad!id"
req 400 "an id too long" "${A[@]}" -X POST "$U/v1/sessions/$(printf 'x%.0s' $(seq 1 70))"
req 400 "unknown field creating a chosen id" "${A[@]}" "$U/v1/sessions/c3" -d '{"nope":1}'
req 200 "delete the chosen id" "${A[@]}" -X DELETE "$U/v1/sessions/chat-42.a_B"
req 200 "the id taken again" "${A[@]}" -X POST "$U/v1/sessions/chat-42.a_B"
[ "$(jget 'b.tokens_held')" = 0 ] && ok || bad "the id taken again is a new session: $(head -c 300 "$T/body")"
req 200 "delete it again" "${A[@]}" -X DELETE "$U/v1/sessions/chat-42.a_B"
req 200 "delete c2" "${A[@]}" -X DELETE "$U/v1/sessions/c2"
req 200 "append chat messages" "${A[@]}" "$U/v1/sessions/$SID2/append" -d '{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}'
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
[ "$n_ok" -ge 27 ] && ok || { bad "openai client: only $n_ok checks passed"; tail -5 "$T/client.out"; }
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
# any of the five checked requests (greedy, seeded, chat, json_object, json_schema) may be the one that
# shared a step with rows at other positions; at least one must be caught
grep -q '^FAIL invariance under load: ' "$T/faulty.out" && ok || bad "every invariance check passed under rope-scalar-offset"
stop "$LAST_PID" faulty

# ... and the echo check fails when a step's rows are not each computed alone: under row-order (odd rows
# of a step sum their norms in another order) the prompt rows of the scoring differ from the decode rows
start efault --inject row-order
U=http://127.0.0.1:$PORT
r=$(echo_score)
case $r in "differ: "*) ok ;; *) bad "under row-order the echoed scoring equals the completion: the echo check cannot fail ($r)" ;; esac
stop "$LAST_PID" efault

# n choices decode in one batch: under split-kv-by-batch (a step of several rows cuts its key blocks
# at half the size) they are not the requests alone, so the n check above can fail
start nfault --inject split-kv-by-batch
U=http://127.0.0.1:$PORT
NP='"model":"tiny","prompt":"The quick brown fox jumps over the lazy dog, and then","max_tokens":24,"logprobs":1'
req 200 "n 4 under split-kv-by-batch" "$U/v1/completions" -d "{$NP,\"n\":4,\"seed\":31}"
cp "$T/body" "$T/n4f"
same=0
for j in 0 1 2 3; do
    curl -s -m 60 -o "$T/n4s" "$U/v1/completions" -d "{$NP,\"seed\":$((31 + j))}"
    same_choice "$T/n4f" $j "$T/n4s" && same=$((same + 1))
done
[ $same -lt 4 ] && ok || bad "under split-kv-by-batch all 4 choices equal their requests alone: the n check cannot fail"
stop "$LAST_PID" nfault
# concurrent requests whose prompts share a long prefix (--share-prefix, default 32 tokens): the later
# ones copy it from the first's session; each answer is still the request's alone.
# auto_share TAG: rounds of 4 concurrent requests (one 560-byte prefix, a byte a token, prefilled 16 a
# step) until the server shares (at most 5); prints "TOKENS_SHARED EQUAL_ALONE" of the last round
auto_share() {
    local tag=$1 pre sh0 sh1 eq=0 r j pids
    pre=$(printf 'common prefix %.0s' $(seq 40))
    for r in 1 2 3 4 5; do
        sh0=$(shared_total); pids=""
        for j in 0 1 2 3; do
            curl -s -m 60 -o "$T/as.$tag.$j" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":\"$pre tail $j\",\"max_tokens\":8,\"seed\":$j,\"temperature\":0.9,\"logprobs\":1}" &
            pids="$pids $!"
        done
        wait $pids
        sh1=$(shared_total)
        [ "$sh1" -gt "$sh0" ] && break
    done
    for j in 0 1 2 3; do
        curl -s -m 60 -o "$T/as.$tag.alone" "$U/v1/completions" -d "{\"model\":\"tiny\",\"prompt\":\"$pre tail $j\",\"max_tokens\":8,\"seed\":$j,\"temperature\":0.9,\"logprobs\":1}"
        same_choice "$T/as.$tag.$j" 0 "$T/as.$tag.alone" && eq=$((eq + 1))
    done
    echo "$((sh1 - sh0)) $eq"
}
start ashare --prefill-chunk 16
U=http://127.0.0.1:$PORT
read -r sh eq <<<"$(auto_share clean)"
[ "$sh" -gt 0 ] && [ "$eq" = 4 ] && ok || bad "concurrent requests with one prefix: $sh tokens shared, $eq of 4 equal to the request alone"
stop "$LAST_PID" ashare
# ... and under share-early (the copies of choice 0's session are taken a token early) choices 1-3
# differ from their requests alone, while choice 0 does not; so do concurrent requests that shared
start sfault --inject share-early --prefill-chunk 16
U=http://127.0.0.1:$PORT
read -r sh eq <<<"$(auto_share fault)"
[ "$sh" -gt 0 ] && [ "$eq" -lt 4 ] && ok || bad "under share-early: $sh tokens shared, $eq of 4 concurrent requests equal alone: the check cannot fail"
req 200 "n 4 under share-early" "$U/v1/completions" -d "{$NP,\"n\":4,\"seed\":31}"
cp "$T/body" "$T/n4e"
same=""
for j in 0 1 2 3; do
    curl -s -m 60 -o "$T/n4s" "$U/v1/completions" -d "{$NP,\"seed\":$((31 + j))}"
    same_choice "$T/n4e" $j "$T/n4s" && same="$same$j"
done
[ "$same" = 0 ] && ok || bad "under share-early the choices equal to their requests alone are '$same', want only 0: the sharing check cannot fail"
stop "$LAST_PID" sfault

# over capacity: one generation at a time, no queue, a small memory budget; 20 ms per token, so the
# long stream (20 s) holds the only slot until the client goes away
start small --max-batch 1 --max-queue 0 --memory-budget 1200K --timeout 20 --token-delay-ms 20
# the start-up line: a given budget with no default note; without one (the main server, CPU backend) the
# host rule's note
grep -q 'backend cpu, KV budget 1 MiB$' "$T/small.log" && ok || bad "a given budget's start-up line: $(grep -m1 'KV budget' "$T/small.log")"
grep -q "KV budget [0-9]* MiB (default: half the machine's memory less the weights)" "$T/main.log" && ok ||
    bad "the default budget's start-up line: $(grep -m1 'KV budget' "$T/main.log")"
U=http://127.0.0.1:$PORT
curl -s -N -m 20 "$U/v1/completions" -d '{"model":"tiny","prompt":"a long one","max_tokens":1000,"stream":true,"seed":5}' > /dev/null 2>&1 &
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
# (greedy, so no sampled end of text cuts a request short)
# holds it for 3 s while a streaming and a plain request wait; a client stalled mid-request is cut off
start queue --max-batch 1 --max-queue 4 --idle-timeout 1 --token-delay-ms 50 --kv-dtype f16
U=http://127.0.0.1:$PORT
# --kv-dtype f16: a session's KV takes half the bytes (tiny model: 512 per token instead of 1024)
req 200 "f16 session create" -X POST "$U/v1/sessions" -d '{"kv":"sink:4,window:32"}'
req 200 "f16 session info" "$U/v1/sessions/$(jget b.id)"
[ "$(jget 'b.kv_bytes')" = "$(( (4 + 32 + 64) * 512 ))" ] && ok || bad "f16 session info: $(cat "$T/body")"
curl -s -N -m 30 "$U/v1/completions" -d '{"model":"tiny","prompt":"a","temperature":0,"max_tokens":60,"stream":true}' > "$T/q0" 2>&1 &
Q0=$!
for _ in $(seq 1 100); do curl -s "$U/metrics" | grep -q '^isobatch_jobs_active 1' && break; sleep 0.05; done
curl -s -N -m 30 "$U/v1/completions" -d '{"model":"tiny","prompt":"b","temperature":0,"max_tokens":4,"stream":true}' > "$T/q1" 2>&1 &
Q1=$!
curl -s -m 30 -o "$T/q2" -w '%{http_code}' "$U/v1/completions" -d '{"model":"tiny","prompt":"c","temperature":0,"max_tokens":4}' > "$T/q2code" 2>&1 &
Q2=$!
wait $Q0 $Q1 $Q2
for q in q0 q1; do tail -c 200 "$T/$q" | grep -q 'data: \[DONE\]' && ok || bad "queued stream $q cut off: $(tail -c 200 "$T/$q")"; done
[ "$(cat "$T/q2code")" = 200 ] && grep -q '"completion_tokens":4' "$T/q2" && ok || bad "queued plain request: $(cat "$T/q2code") $(head -c 200 "$T/q2")"
exec 3<>"/dev/tcp/127.0.0.1/$PORT"
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{' >&3
timeout 10 cat <&3 > /dev/null; [ $? != 124 ] && ok || bad "a stalled request was not closed by the idle timeout"
exec 3<&-
stop "$LAST_PID" queue

# IPv6: --host ::1 listens on the IPv6 loopback
start v6 --host ::1
req 200 "IPv6 bind" -g "http://[::1]:$PORT/health"
grep -q "http://\[::1\]:$PORT" "$T/v6.log" && ok || bad "IPv6: the startup line does not show http://[::1]:$PORT"
stop "$LAST_PID" v6

# bad flags
"$BIN" serve -m "$T/tiny" --host not-an-ip --port 0 2> "$T/e" && bad "bad --host accepted" || { grep -q "not an IPv4 or IPv6 address" "$T/e" && ok || bad "bad --host: $(cat "$T/e")"; }
"$BIN" serve -m "$T/tiny" --memory-budget lots 2> "$T/e"; [ $? = 2 ] && ok || bad "bad --memory-budget"
finish

#!/usr/bin/env bash
# Function calling through `isobatch serve` (the ASan/UBSan build when there is one), on the tiny model
# with a chat template that writes <tool_call> blocks (Qwen's tool form: src/server/tool_calls.c):
#   - a named tool_choice: the reply is the call (finish_reason "tool_calls", content null), its
#     arguments one JSON object of the function's parameters schema; the same request with
#     tool_choice "none" gives no call (the check can fail); batched equals alone, and not under the
#     split-kv-by-batch fault;
#   - the prompt the server built (the verification record's ids, detokenized) is the format's text,
#     written out here by hand: the tools block, an assistant's calls, a run of tool results;
#   - tool_choice "auto": the tiny model writes no call, so a plain reply with no tool_calls;
#   - streamed, the same replies (calls, content, logprobs) as the bodies;
#   - refusals, each a 400 naming the field: "required", bad tools, response_format
#     with a named function, a parameters schema outside the subset, and tools or tool messages on a
#     model whose template has no tool calls.
set -u
. "$(dirname "$0")/server_bins.sh"
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_tools_XXXXXX)
export ISOBATCH_DATA_DIR=$T/data
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT
finish() { echo "t_tools: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit; }
command -v curl >/dev/null || { bad "curl not found (apt-get install curl)"; finish; }
command -v node >/dev/null || { bad "node not found (apt-get install nodejs)"; finish; }
[ -x "$BIN" ] || { bad "$BIN missing (run make)"; finish; }
"$BIN" mkmodel --preset tiny --seed 9 --out "$T/tiny" >/dev/null || { bad "mkmodel"; finish; }
cp -r "$T/tiny" "$T/tools"
node -e '
const fs = require("fs"), p = process.argv[1], c = JSON.parse(fs.readFileSync(p, "utf8"));
c.chat_template = "{%- for m in messages %}{{- \"<|im_start|>\" + m.role + \"\\n\" + m.content + \"<|im_end|>\\n\" }}{%- endfor %}" +
                  "{#- calls as <tool_call> blocks #}{%- if add_generation_prompt %}{{- \"<|im_start|>assistant\\n\" }}{%- endif %}";
fs.writeFileSync(p, JSON.stringify(c));' "$T/tools/tokenizer_config.json" || { bad "template"; finish; }

# start NAME MODEL [ARGS...]: a server on a free port; sets PORT
start() { local name=$1 model=$2; shift 2; serve_start "$name" "$T/$model" --max-tokens 200 "$@"; }
stop() {
    kill -TERM "$1"
    for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    wait "$1"; [ $? = 0 ] && ok || bad "$2: exit status"
    grep -qE "AddressSanitizer|runtime error|LeakSanitizer" "$T/$2.log" && { bad "$2: sanitizer report"; head -30 "$T/$2.log"; } || ok
}
req() { # EXPECTED_CODE NAME URL BODY: body in $T/body
    local code
    code=$(curl -s -m 60 -o "$T/body" -w '%{http_code}' "$3" -d "$4")
    [ "$code" = "$1" ] && ok || bad "$2: HTTP $code, want $1: $(head -c 300 "$T/body")"
}
jget() { node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); console.log(eval(process.argv[2]))' "$T/body" "$1" 2>/dev/null; }
field_400() { # NAME CODE PARAM BODY (on $U)
    req 400 "$1" "$U/v1/chat/completions" "$4"
    [ "$(jget 'b.error.code + " " + b.error.param')" = "$2 $3" ] && ok || bad "$1: want $2 naming $3: $(head -c 300 "$T/body")"
}

start tools tools
U=http://127.0.0.1:$PORT
TOOLS='"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"enum":["Paris","Rome","Oslo"]}},"required":["city"],"additionalProperties":false}}},{"type":"function","function":{"name":"get_time"}}]'
# whitespace ids made less likely (the random model would spend its tokens on it), as in t_serve.sh
BASE='"model":"tools","messages":[{"role":"user","content":"weather in Rome?"}],"max_tokens":60,"temperature":0.9,"logprobs":true,"logit_bias":{"9":-3,"10":-3,"13":-3,"32":-3}'
FORCE='"tool_choice":{"type":"function","function":{"name":"get_weather"}}'

# ---- a named tool_choice: the reply is that call, its arguments valid for the schema
calls=0
for seed in 1 2 3 4; do
    req 200 "forced call seed $seed" "$U/v1/chat/completions" "{$BASE,$TOOLS,$FORCE,\"seed\":$seed}"
    cp "$T/body" "$T/forced$seed"
    v=$(jget 'const c=b.choices[0], m=c.message; if (c.finish_reason==="length") "length"; else if (c.finish_reason!=="tool_calls" || m.content!==null || m.tool_calls.length!==1) "NOT A CALL"; else { const t=m.tool_calls[0], a=JSON.parse(t.function.arguments); (t.type==="function" && t.function.name==="get_weather" && t.id==="call_"+b.id+"_0" && Object.keys(a).length===1 && ["Paris","Rome","Oslo"].includes(a.city)) ? "call" : "INVALID" }')
    case $v in call) ok; calls=$((calls+1)) ;; length) ;; *) bad "forced call seed $seed: $v: $(head -c 400 "$T/body")" ;; esac
done
[ "$calls" -ge 3 ] && ok || bad "forced calls: only $calls of 4 completed"
# the check can fail: the same requests with tool_choice "none" are no calls
req 200 "tool_choice none" "$U/v1/chat/completions" "{$BASE,$TOOLS,\"tool_choice\":\"none\",\"seed\":1}"
[ "$(jget 'const c=b.choices[0]; c.finish_reason!=="tool_calls" && c.message.tool_calls===undefined && typeof c.message.content==="string"')" = true ] \
    && ok || bad "tool_choice none: $(head -c 300 "$T/body")"
# batched equals alone: the four forced requests at once give the same arguments and logprobs
key='const c=JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0]; console.log(JSON.stringify([c.finish_reason, c.message.tool_calls ? c.message.tool_calls[0].function.arguments : c.message.content, c.logprobs.content.map(e=>[e.token_id,e.logprob])]))'
# batched_same URL TAG: the four forced requests at once against the same ones alone ($T/TAG<seed>);
# prints how many are equal
batched_same() {
    local CP=() same=0 seed a b
    for seed in 1 2 3 4; do
        curl -s -m 60 "$1/v1/chat/completions" -d "{$BASE,$TOOLS,$FORCE,\"seed\":$seed}" > "$T/$2_b$seed" &
        CP+=($!)
    done
    wait "${CP[@]}"
    for seed in 1 2 3 4; do
        a=$(node -e "$key" "$T/$2$seed"); b=$(node -e "$key" "$T/$2_b$seed")
        [ -n "$a" ] && [ "$a" = "$b" ] && same=$((same+1))
    done
    echo $same
}
same=$(batched_same "$U" forced)
[ "$same" = 4 ] && ok || bad "forced calls: $same of 4 batched replies equal to the same request alone"

# ---- the prompt: the format's text (the verification record's prompt ids, detokenized)
CONV='"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"},{"role":"tool","content":"4 C"}]'
req 200 "conversation with tool results" "$U/v1/chat/completions" "{\"model\":\"tools\",$CONV,$TOOLS,\"max_tokens\":4,\"seed\":1}"
node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1])); console.log(JSON.stringify({tokens: b.verification.prompt}))' "$T/body" > "$T/ids.json"
curl -s -m 30 "$U/detokenize" -d @"$T/ids.json" > "$T/body"
WANT='<|im_start|>system
Be brief.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}}, "required": ["city"], "additionalProperties": false}}}
{"type": "function", "function": {"name": "get_time"}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
weather?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Oslo"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
sunny
</tool_response>
<tool_response>
4 C
</tool_response><|im_end|>
<|im_start|>assistant
'
GOT=$(jget 'b.content'; echo x); GOT=${GOT%x}
[ "$GOT" = "$WANT"$'\n' ] && ok || { bad "the prompt with tools differs from the format's text:"; printf '%s' "$GOT" | diff <(printf '%s\n' "$WANT") - | head -20; }

# ---- tool_choice auto: declared; the tiny model writes no call, so a plain reply
req 200 "auto" "$U/v1/chat/completions" "{$BASE,$TOOLS,\"seed\":2}"
[ "$(jget 'const c=b.choices[0]; (c.finish_reason==="stop"||c.finish_reason==="length") && c.message.tool_calls===undefined && typeof c.message.content==="string"')" = true ] \
    && ok || bad "auto: $(head -c 300 "$T/body")"

# ---- streamed: the same replies as the bodies above, chunk by chunk (the content held back where a call
# may begin, the calls in one delta with their index, then finish_reason)
SSE='const fs=require("fs"); const ev=fs.readFileSync(process.argv[1],"utf8").split("\n").filter(l=>l.startsWith("data: ")&&l!=="data: [DONE]").map(l=>JSON.parse(l.slice(6)));
let content="", calls=[], fin=null, ids=[], nulls=0;
for (const e of ev) { const c=e.choices[0]; if (!c) continue; const d=c.delta; if (d.content) content+=d.content; if (d.tool_calls) calls=calls.concat(d.tool_calls.map(t=>({index:t.index,id:t.id,name:t.function.name,arguments:t.function.arguments}))); if (c.finish_reason) fin=c.finish_reason; if (c.logprobs) ids=ids.concat(c.logprobs.content.map(x=>x.token_id)); }
console.log(JSON.stringify([fin, content, calls, ids]));'
BODYKEY='const b=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); const c=b.choices[0], m=c.message;
console.log(JSON.stringify([c.finish_reason, m.content||"", (m.tool_calls||[]).map((t,i)=>({index:i,id:t.id.replace(b.id,process.argv[2]),name:t.function.name,arguments:t.function.arguments})), c.logprobs.content.map(x=>x.token_id)]))'
curl -s -N -m 60 "$U/v1/chat/completions" -d "{$BASE,$TOOLS,$FORCE,\"seed\":1,\"stream\":true}" > "$T/sse_forced"
sid=$(grep -m1 -o '"id":"chatcmpl-[0-9a-f]*"' "$T/sse_forced" | cut -d'"' -f4)
a=$(node -e "$SSE" "$T/sse_forced"); b=$(node -e "$BODYKEY" "$T/forced1" "$sid")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "streamed forced call differs from the body: $a vs $b"
case $a in '["tool_calls","",[{"index":0,'*) ok ;; *) bad "streamed forced call: $a" ;; esac
curl -s -m 60 -o "$T/auto2" "$U/v1/chat/completions" -d "{$BASE,$TOOLS,\"seed\":2}"
curl -s -N -m 60 "$U/v1/chat/completions" -d "{$BASE,$TOOLS,\"seed\":2,\"stream\":true}" > "$T/sse_auto"
sid=$(grep -m1 -o '"id":"chatcmpl-[0-9a-f]*"' "$T/sse_auto" | cut -d'"' -f4)
a=$(node -e "$SSE" "$T/sse_auto"); b=$(node -e "$BODYKEY" "$T/auto2" "$sid")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "streamed auto reply differs from the body: $a vs $b"

# ---- refusals
CH='"model":"tools","messages":[{"role":"user","content":"hi"}],"max_tokens":4'
field_400 "tool_choice required" unsupported_parameter tool_choice "{$CH,$TOOLS,\"tool_choice\":\"required\"}"
field_400 "tool_choice without tools" invalid_value tool_choice "{$CH,\"tool_choice\":\"auto\"}"
field_400 "a tool without a name" invalid_value tools "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{}}]}"
field_400 "tool_choice naming no tool" invalid_value tool_choice "{$CH,$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}"
field_400 "response_format with a named function" invalid_value response_format "{$CH,$TOOLS,$FORCE,\"response_format\":{\"type\":\"json_object\"}}"
field_400 "parameters outside the schema subset" unsupported_parameter tools "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0}}}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}"
field_400 "a tool message without content" invalid_value messages "{\"model\":\"tools\",\"messages\":[{\"role\":\"tool\"}],$TOOLS}"
field_400 "functions (the old form)" unsupported_parameter functions "{$CH,\"functions\":[{\"name\":\"f\"}]}"
stop "$LAST_PID" tools

# ---- the batched-equals-alone check fails when the server batches wrongly: under split-kv-by-batch a
# step of several rows cuts key blocks of half the size (a 2 ms delay a token keeps the four together)
start faulty tools --inject split-kv-by-batch --token-delay-ms 2
U=http://127.0.0.1:$PORT
for seed in 1 2 3 4; do
    curl -s -m 60 -o "$T/fault$seed" "$U/v1/chat/completions" -d "{$BASE,$TOOLS,$FORCE,\"seed\":$seed}"
done
same=$(batched_same "$U" fault)
[ "$same" -lt 4 ] && ok || bad "under split-kv-by-batch all 4 batched forced calls equal alone: the check cannot fail"
stop "$LAST_PID" faulty

# ---- a model whose chat template has no tool calls
start plain tiny
U=http://127.0.0.1:$PORT
CH='"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4'
field_400 "tools on a template without tool calls" unsupported_parameter tools "{$CH,$TOOLS}"
field_400 "tool messages on a template without tool calls" unsupported_parameter messages "{\"model\":\"tiny\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}],\"max_tokens\":4}"
req 200 "tool_choice none without tools there" "$U/v1/chat/completions" "{$CH,\"tool_choice\":\"none\"}"
stop "$LAST_PID" plain
finish

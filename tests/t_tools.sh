#!/usr/bin/env bash
# Function calling through `isobatch serve` (the ASan/UBSan build when there is one), on the tiny model
# with a chat template that writes <tool_call> blocks (Qwen's tool form: src/server/tool_calls.c):
#   - a named tool_choice: the reply is the call (finish_reason "tool_calls", content null), its
#     arguments one JSON object of the function's parameters schema; the same request with
#     tool_choice "none" gives no call (the check can fail); batched equals alone, and not under the
#     split-kv-by-batch fault;
#   - the prompt the server built (the verification record's ids, detokenized) is the format's text,
#     written out here by hand: the tools block, an assistant's calls, a run of tool results;
#   - tool_choice "required": every reply that is not cut off by max_tokens is one or more calls
#     (finish_reason "tool_calls", content null) of declared functions, each call's arguments valid for
#     its function's parameters (checked by python3's jsonschema, not by the server's reader); at least
#     two different functions chosen over the seeds, and a reply of two calls, which with
#     parallel_tool_calls false is one call; batched equals alone, and not under split-kv-by-batch;
#   - tool_choice "auto": the tiny model writes no call, so a plain reply with no tool_calls;
#   - the verification records of named and "required" replies hold their constraint (the functions,
#     the choice, parallel_tool_calls) and verify; edited ones diverge, malformed ones are refused
#     (tests/verify_tools.py);
#   - streamed, the same replies (calls, content, logprobs) as the bodies (a named call, two calls of
#     "required", "auto");
#   - refusals, each a 400 naming the field: bad tools, response_format with a named function or with
#     "required", "required" without tools, a parameters schema outside the subset (named or
#     "required"), and tools or tool messages on a model whose template has no tool calls;
#   - Gemma 4's tool form (the tiny Gemma 4 model with Gemma 4's special tokens and a template writing
#     <|tool_call>): the prompt of a conversation with tools, a call and its result is the format's text
#     written out by hand (declarations after the system text, the result in the call's model turn, left
#     open); <|tool_response> ends replies with tools (not plain ones); "auto" gives a plain reply, also with call openings made
#     likely, streamed the same; a property without a type written; "required" and a named function
#     decoded in Gemma 4's syntax: calls of declared functions with valid arguments, one with parallel
#     off, batched equal to alone (and not under split-kv-by-batch), records that verify, streamed the
#     same; a list as a description, a tool message with no call before it and arguments that are no
#     object are 400s naming the field.
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
# a python3 with jsonschema: the first on PATH, else the system's (Debian's python3-jsonschema lives there
# when PATH's python3 is another installation)
PY=""
for p in python3 /usr/bin/python3; do "$p" -c 'import jsonschema' 2>/dev/null && { PY=$p; break; }; done
[ -n "$PY" ] || { bad "python3 with jsonschema not found (apt-get install python3-jsonschema)"; finish; }
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
# stop, req (server_checks.sh); a request here may decode 200 tokens on the sanitizer build
. "$(dirname "$0")/server_checks.sh"
REQ_TIMEOUT_S=60
post() { req "$1" "$2" "$3" -d "$4"; }   # EXPECTED_CODE NAME URL BODY: body in $T/body
jget() { node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")); console.log(eval(process.argv[2]))' "$T/body" "$1" 2>/dev/null; }
field_400() { # NAME CODE PARAM BODY (on $U)
    post 400 "$1" "$U/v1/chat/completions" "$4"
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
    post 200 "forced call seed $seed" "$U/v1/chat/completions" "{$BASE,$TOOLS,$FORCE,\"seed\":$seed}"
    cp "$T/body" "$T/forced$seed"
    v=$(jget 'const c=b.choices[0], m=c.message; if (c.finish_reason==="length") "length"; else if (c.finish_reason!=="tool_calls" || m.content!==null || m.tool_calls.length!==1) "NOT A CALL"; else { const t=m.tool_calls[0], a=JSON.parse(t.function.arguments); (t.type==="function" && t.function.name==="get_weather" && t.id==="call_"+b.id+"_0" && Object.keys(a).length===1 && ["Paris","Rome","Oslo"].includes(a.city)) ? "call" : "INVALID" }')
    case $v in call) ok; calls=$((calls+1)) ;; length) ;; *) bad "forced call seed $seed: $v: $(head -c 400 "$T/body")" ;; esac
done
[ "$calls" -ge 3 ] && ok || bad "forced calls: only $calls of 4 completed"
# the check can fail: the same requests with tool_choice "none" are no calls
post 200 "tool_choice none" "$U/v1/chat/completions" "{$BASE,$TOOLS,\"tool_choice\":\"none\",\"seed\":1}"
[ "$(jget 'const c=b.choices[0]; c.finish_reason!=="tool_calls" && c.message.tool_calls===undefined && typeof c.message.content==="string"')" = true ] \
    && ok || bad "tool_choice none: $(head -c 300 "$T/body")"
# batched equals alone: the four forced requests at once give the same arguments and logprobs
key='const c=JSON.parse(require("fs").readFileSync(process.argv[1])).choices[0]; console.log(JSON.stringify([c.finish_reason, c.message.tool_calls ? c.message.tool_calls.map(t=>[t.function.name,t.function.arguments]) : c.message.content, c.logprobs.content.map(e=>[e.token_id,e.logprob])]))'
# batched_same URL TAG BODY: the four requests {BODY,"seed":1..4} at once against the same ones alone
# ($T/TAG<seed>); prints how many are equal
batched_same() {
    local CP=() same=0 seed a b
    for seed in 1 2 3 4; do
        curl -s -m 60 "$1/v1/chat/completions" -d "{$3,\"seed\":$seed}" > "$T/$2_b$seed" &
        CP+=($!)
    done
    wait "${CP[@]}"
    for seed in 1 2 3 4; do
        a=$(node -e "$key" "$T/$2$seed"); b=$(node -e "$key" "$T/$2_b$seed")
        [ -n "$a" ] && [ "$a" = "$b" ] && same=$((same+1))
    done
    echo $same
}
same=$(batched_same "$U" forced "$BASE,$TOOLS,$FORCE")
[ "$same" = 4 ] && ok || bad "forced calls: $same of 4 batched replies equal to the same request alone"

# ---- tool_choice "required": a call (or, with parallel_tool_calls, calls) of declared functions,
# each one's arguments valid for its parameters (python3's jsonschema); replies cut by max_tokens aside
RTOOLS_A='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"enum":["Paris","Rome","Oslo"]}},"required":["city"],"additionalProperties":false}}},{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"enum":["UTC","CET"]}},"additionalProperties":false}}},{"type":"function","function":{"name":"set_alarm","parameters":{"type":"object","properties":{"hour":{"type":"integer"},"days":{"type":"array","items":{"enum":["mon","tue"]},"maxItems":2}},"required":["hour"],"additionalProperties":false}}}]'
RTOOLS="\"tools\":$RTOOLS_A"
RBASE='"model":"tools","messages":[{"role":"user","content":"weather in Rome?"}],"max_tokens":200,"temperature":0.9,"logprobs":true,"logit_bias":{"9":-3,"10":-3,"13":-3,"32":-3}'
REQ='"tool_choice":"required"'
# prints "length", or the number of calls and their names, or what is wrong
RCHECK='import json, sys, jsonschema
b = json.load(open(sys.argv[1]))
params = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in json.loads(sys.argv[2])}
c = b["choices"][0]; m = c["message"]; calls = m.get("tool_calls") or []
if c["finish_reason"] == "length": print("length"); sys.exit()
if c["finish_reason"] != "tool_calls" or m["content"] is not None or not calls: print("NOT A CALL"); sys.exit()
for k, t in enumerate(calls):
    f = t["function"]
    if t["type"] != "function" or t["id"] != "call_%s_%d" % (b["id"], k) or f["name"] not in params: print("BAD CALL", t); sys.exit()
    try: jsonschema.validate(json.loads(f["arguments"]), params[f["name"]])
    except Exception as e: print("INVALID", f["name"], f["arguments"], str(e).splitlines()[0]); sys.exit()
print(len(calls), " ".join(t["function"]["name"] for t in calls))'
# required_seeds NAME TAG BODY SEEDS MIN: the "required" request BODY with each seed of SEEDS (its
# reply kept as $T/TAG<seed>), checked by RCHECK; at least MIN whole calls, two functions among them,
# and some seed with two calls (listed in $multi)
required_seeds() {
    local rcalls=0 rnames="" seed v n=0
    multi=""
    for seed in $4; do
        n=$((n+1))
        post 200 "$1 seed $seed" "$U/v1/chat/completions" "{$3,\"seed\":$seed}"
        cp "$T/body" "$T/$2$seed"
        v=$("$PY" -c "$RCHECK" "$T/body" "$RTOOLS_A" 2>&1)
        case $v in
            [1-9]*) ok; rcalls=$((rcalls+1)); rnames="$rnames ${v#* }"; [ "${v%% *}" -ge 2 ] && multi="$multi $seed" ;;
            length) ;;
            *) bad "$1 seed $seed: $v: $(head -c 400 "$T/body")" ;;
        esac
    done
    [ "$rcalls" -ge "$5" ] && ok || bad "$1: only $rcalls of $n replies were whole calls"
    [ "$(printf '%s\n' $rnames | sort -u | wc -l)" -ge 2 ] && ok || bad "$1: always the same function:$rnames"
    [ -n "$multi" ] && ok || bad "$1: no seed of $4 gave two calls (parallel_tool_calls is on by default)"
}
required_seeds required required "$RBASE,$RTOOLS,$REQ" "1 2 3 4 5 6 7 8" 6
# parallel_tool_calls false: each reply one call; the seeds that gave two give one (the check can fail)
for seed in 1 2 3 4 5 6 7 8; do
    post 200 "required, parallel off, seed $seed" "$U/v1/chat/completions" "{$RBASE,$RTOOLS,$REQ,\"parallel_tool_calls\":false,\"seed\":$seed}"
    cp "$T/body" "$T/reqp$seed"
    v=$("$PY" -c "$RCHECK" "$T/body" "$RTOOLS_A" 2>&1)
    case " $multi " in *" $seed "*) [ "${v%% *}" = 1 ] && ok || bad "required, parallel off, seed $seed: $v (not one call)" ;; esac
    case $v in "1 "*|length) ok ;; *) bad "required, parallel off, seed $seed: $v: $(head -c 400 "$T/body")" ;; esac
done
for seed in 1 2 3 4; do cp "$T/required$seed" "$T/reqb$seed"; done
same=$(batched_same "$U" reqb "$RBASE,$RTOOLS,$REQ")
[ "$same" = 4 ] && ok || bad "required: $same of 4 batched replies equal to the same request alone"

# ---- the prompt: the format's text (the verification record's prompt ids, detokenized)
CONV='"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"},{"role":"tool","content":"4 C"}]'
post 200 "conversation with tool results" "$U/v1/chat/completions" "{\"model\":\"tools\",$CONV,$TOOLS,\"max_tokens\":4,\"seed\":1}"
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
post 200 "auto" "$U/v1/chat/completions" "{$BASE,$TOOLS,\"seed\":2}"
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
# streamed_two NAME BODY TAG SEEDS: the first seed of SEEDS (whose "required" reply $T/TAG<seed> is two
# calls) streamed: the same calls, content and logprobs as the body, both calls in the final delta
streamed_two() {
    local ms=${4# } sid a b
    ms=${ms%% *}
    [ -n "$ms" ] || return 0
    curl -s -N -m 60 "$U/v1/chat/completions" -d "{$2,\"seed\":$ms,\"stream\":true}" > "$T/sse_$3"
    sid=$(grep -m1 -o '"id":"chatcmpl-[0-9a-f]*"' "$T/sse_$3" | cut -d'"' -f4)
    a=$(node -e "$SSE" "$T/sse_$3"); b=$(node -e "$BODYKEY" "$T/$3$ms" "$sid")
    [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "$1: streamed \"required\" calls differ from the body: $a vs $b"
    case $a in '["tool_calls","",[{"index":0,'*'{"index":1,'*) ok ;; *) bad "$1: streamed \"required\" calls: $a" ;; esac
}
streamed_two qwen "$RBASE,$RTOOLS,$REQ" required "$multi"
curl -s -m 60 -o "$T/auto2" "$U/v1/chat/completions" -d "{$BASE,$TOOLS,\"seed\":2}"
curl -s -N -m 60 "$U/v1/chat/completions" -d "{$BASE,$TOOLS,\"seed\":2,\"stream\":true}" > "$T/sse_auto"
sid=$(grep -m1 -o '"id":"chatcmpl-[0-9a-f]*"' "$T/sse_auto" | cut -d'"' -f4)
a=$(node -e "$SSE" "$T/sse_auto"); b=$(node -e "$BODYKEY" "$T/auto2" "$sid")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "streamed auto reply differs from the body: $a vs $b"

# ---- refusals
CH='"model":"tools","messages":[{"role":"user","content":"hi"}],"max_tokens":4'
field_400 "tool_choice required without tools" invalid_value tool_choice "{$CH,\"tool_choice\":\"required\"}"
field_400 "tool_choice required with empty tools" invalid_value tool_choice "{$CH,\"tools\":[],\"tool_choice\":\"required\"}"
field_400 "response_format with required" invalid_value response_format "{$CH,$TOOLS,$REQ,\"response_format\":{\"type\":\"json_object\"}}"
field_400 "required, a tool's parameters outside the subset" unsupported_parameter tools "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},{\"type\":\"function\",\"function\":{\"name\":\"g\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}}}],$REQ}"
case $(jget 'b.error.message') in *"the parameters of 'g' (tool_choice \"required\")"*pattern*) ok ;; *) bad "required, parameters outside the subset: $(head -c 300 "$T/body")" ;; esac
[ "$(jget 'b.error.message.includes("\n")')" = false ] && ok || bad "a refusal's message is not one line"
field_400 "required, parameters that are no object" invalid_value tools "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"number\"}}}],$REQ}"
case $(jget 'b.error.message') in *"the parameters of 'f' (tool_choice \"required\") must describe an object"*) ok ;; *) bad "parameters that are no object: $(head -c 300 "$T/body")" ;; esac
field_400 "named, parameters that are no object" invalid_value tools "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"enum\":[1]}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}"
field_400 "tool_choice without tools" invalid_value tool_choice "{$CH,\"tool_choice\":\"auto\"}"
field_400 "a tool without a name" invalid_value tools "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{}}]}"
field_400 "tool_choice naming no tool" invalid_value tool_choice "{$CH,$TOOLS,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}"
field_400 "response_format with a named function" invalid_value response_format "{$CH,$TOOLS,$FORCE,\"response_format\":{\"type\":\"json_object\"}}"
field_400 "parameters outside the schema subset" unsupported_parameter tools "{$CH,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0}}}}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}"
field_400 "a tool message without content" invalid_value messages "{\"model\":\"tools\",\"messages\":[{\"role\":\"tool\"}],$TOOLS}"
field_400 "functions (the old form)" unsupported_parameter functions "{$CH,\"functions\":[{\"name\":\"f\"}]}"

# ---- verification records of the forced calls: the constraint in the record, each re-run matching;
# edited constraints diverging, malformed ones refused (tests/verify_tools.py; the CLI is $SBIN's)
"$PY" "$ROOT/tests/verify_tools.py" "$U" "$SBIN" "$T/tools" "$T" "$RTOOLS_A" "$T"/forced[1-4] -- "$T"/required[1-8] -- "$T"/reqp[1-8] > "$T/vt.log" 2>&1
grep '^FAIL' "$T/vt.log"
vt=$(tail -1 "$T/vt.log"); echo "  $vt"
case $vt in "verify_tools: "*" passed, "*" failed")
    n=${vt#verify_tools: }; pass=$((pass + ${n%% *})); n=${n#* passed, }; fail=$((fail + ${n%% *})) ;;
    *) bad "verify_tools.py did not finish: $(tail -5 "$T/vt.log")" ;; esac
stop "$LAST_PID" tools

# ---- the batched-equals-alone check fails when the server batches wrongly: under split-kv-by-batch a
# step of several rows cuts key blocks of half the size (a 2 ms delay a token keeps the four together)
start faulty tools --inject split-kv-by-batch --token-delay-ms 2
U=http://127.0.0.1:$PORT
for seed in 1 2 3 4; do
    curl -s -m 60 -o "$T/fault$seed" "$U/v1/chat/completions" -d "{$BASE,$TOOLS,$FORCE,\"seed\":$seed}"
    curl -s -m 60 -o "$T/rfault$seed" "$U/v1/chat/completions" -d "{$RBASE,$RTOOLS,$REQ,\"seed\":$seed}"
done
same=$(batched_same "$U" fault "$BASE,$TOOLS,$FORCE")
[ "$same" -lt 4 ] && ok || bad "under split-kv-by-batch all 4 batched forced calls equal alone: the check cannot fail"
same=$(batched_same "$U" rfault "$RBASE,$RTOOLS,$REQ")
[ "$same" -lt 4 ] && ok || bad "under split-kv-by-batch all 4 batched \"required\" replies equal alone: the check cannot fail"
stop "$LAST_PID" faulty

# ---- a model whose chat template has no tool calls
start plain tiny
U=http://127.0.0.1:$PORT
CH='"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4'
field_400 "tools on a template without tool calls" unsupported_parameter tools "{$CH,$TOOLS}"
field_400 "required on a template without tool calls" unsupported_parameter tools "{$CH,$TOOLS,$REQ}"
field_400 "tool messages on a template without tool calls" unsupported_parameter messages "{\"model\":\"tiny\",\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}],\"max_tokens\":4}"
post 200 "tool_choice none without tools there" "$U/v1/chat/completions" "{$CH,\"tool_choice\":\"none\"}"
stop "$LAST_PID" plain

# ---- Gemma 4's tool form (src/server/tool_form_gemma4.c): the tiny Gemma 4 model with a byte-level
# tokenizer holding Gemma 4's special tokens and a template that writes <|tool_call>
"$BIN" mkmodel --preset gemma4-tiny --seed 9 --out "$T/g4" >/dev/null || { bad "mkmodel gemma4-tiny"; finish; }
node -e '
const fs = require("fs"), d = process.argv[1], t = JSON.parse(fs.readFileSync(d + "/tokenizer.json", "utf8"));
let id = Math.max(...t.added_tokens.map(a => a.id)) + 1;
for (const s of ["<bos>", "<eos>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>", "<|tool>", "<tool|>",
                 "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", "<|\"|>"])
    t.added_tokens.push({id: id++, content: s, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true});
fs.writeFileSync(d + "/tokenizer.json", JSON.stringify(t));
fs.writeFileSync(d + "/tokenizer_config.json", JSON.stringify({bos_token: "<bos>", eos_token: "<eos>",
    chat_template: "{{ bos_token }}{{ \x27<|turn>\x27 + role }}{{ \x27<|tool_call>call:\x27 }}{{- \x27<|channel>thought\\n<channel|>\x27 -}}"}));' \
    "$T/g4" || { bad "gemma 4 tokenizer"; finish; }
start g4 g4
U=http://127.0.0.1:$PORT
TOOLS4='"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string","enum":["Paris","Rome"]}},"required":["city"]}}},{"type":"function","function":{"name":"get_time"}}]'
CONV4='"messages":[{"role":"system","content":"Be brief. "},{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"{\"temp\": 21, \"sky\": \"clear\"}"}]'
# the prompt: the declarations after the system text, the call and its result in one model turn left
# open, the generation prompt going on in it (written out by hand from the template's rules)
post 200 "gemma 4: conversation with a tool result" "$U/v1/chat/completions" "{\"model\":\"g4\",$CONV4,$TOOLS4,\"max_tokens\":4,\"seed\":1}"
node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1])); console.log(JSON.stringify({tokens: b.verification.prompt}))' "$T/body" > "$T/ids.json"
curl -s -m 30 "$U/detokenize" -d @"$T/ids.json" > "$T/body"
WANT='<bos><|turn>system
Be brief.<|tool>declaration:get_weather{description:<|"|>Weather now<|"|>,parameters:{properties:{city:{enum:[<|"|>Paris<|"|>,<|"|>Rome<|"|>],type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><|tool>declaration:get_time{description:<|"|><|"|>}<tool|><turn|>
<|turn>user
weather?<turn|>
<|turn>model
<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|><|tool_response>response:get_weather{sky:<|"|>clear<|"|>,temp:21}<tool_response|><|channel>thought
<channel|>'
GOT=$(jget 'b.content'; echo x); GOT=${GOT%x}
[ "$GOT" = "$WANT"$'\n' ] && ok || { bad "gemma 4: the prompt with tools differs from the format's text:"; printf '%s' "$GOT" | diff <(printf '%s\n' "$WANT") - | head -20; }
# the same text from the command line: isobatch tokenize --messages M --tools T --render
node -e 'const b=JSON.parse("{"+process.argv[1]+"}"); require("fs").writeFileSync(process.argv[2], JSON.stringify(b.messages));' "$CONV4" "$T/g4m.json"
node -e 'const b=JSON.parse("{"+process.argv[1]+"}"); require("fs").writeFileSync(process.argv[2], JSON.stringify(b.tools));' "$TOOLS4" "$T/g4t.json"
GOT=$("$BIN" tokenize -m "$T/g4" --messages "$T/g4m.json" --tools "$T/g4t.json" --render; echo x); GOT=${GOT%x}
[ "$GOT" = "$WANT" ] && ok || { bad "gemma 4: tokenize --tools --render differs from the format's text:"; printf '%s' "$GOT" | diff <(printf '%s' "$WANT") - | head -10; }
echo '[{"type":"function","function":{"name":"f","parameters":{"properties":{"x":{"type":"string","description":[1]}}}}}]' > "$T/g4bad.json"
err=$("$BIN" tokenize -m "$T/g4" --messages "$T/g4m.json" --tools "$T/g4bad.json" --render 2>&1 >/dev/null); st=$?
[ $st != 0 ] && [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && case $err in *g4bad.json*"description must be a string"*) true ;; *) false ;; esac \
    && ok || bad "gemma 4: tokenize with a bad tools file: status $st, '$err'"
# a reply with tools stops where calls hand over to the tools (<|tool_response>, made likely here); a
# plain chat does not
G4BASE='"model":"g4","messages":[{"role":"user","content":"weather in Rome?"}],"max_tokens":24,"temperature":0.9,"logprobs":true'
curl -s -m 30 "$U/tokenize" -d '{"content":"<|tool_response>"}' > "$T/body"
hid=$(jget 'b.tokens.length === 1 ? b.tokens[0] : -1')
post 200 "gemma 4: the hand-over token" "$U/v1/chat/completions" "{$G4BASE,$TOOLS4,\"seed\":1,\"logit_bias\":{\"$hid\":30}}"
[ "$(jget 'const c=b.choices[0]; c.finish_reason + " " + JSON.stringify(c.message.content) + " " + b.usage.completion_tokens')" = 'stop "" 1' ] \
    && ok || bad "gemma 4: a reply with tools does not stop at <|tool_response> ($hid): $(head -c 300 "$T/body")"
post 200 "gemma 4: the hand-over token without tools" "$U/v1/chat/completions" "{$G4BASE,\"seed\":1,\"logit_bias\":{\"$hid\":30}}"
[ "$(jget 'b.choices[0].message.content.startsWith("<|tool_response>")')" = true ] \
    && ok || bad "gemma 4: a plain chat stops at <|tool_response>: $(head -c 300 "$T/body")"
# auto: the tiny model writes no call, so a plain reply; with <|tool_call> tokens made likely, still no
# call (they are no well-formed call), and the stream holds them back, then gives the same content
post 200 "gemma 4: auto" "$U/v1/chat/completions" "{$G4BASE,$TOOLS4,\"seed\":2}"
[ "$(jget 'const c=b.choices[0]; (c.finish_reason==="stop"||c.finish_reason==="length") && c.message.tool_calls===undefined && typeof c.message.content==="string"')" = true ] \
    && ok || bad "gemma 4: auto: $(head -c 300 "$T/body")"
curl -s -m 30 "$U/tokenize" -d '{"content":"<|tool_call>"}' > "$T/body"
cid=$(jget 'b.tokens.length === 1 ? b.tokens[0] : -1')
post 200 "gemma 4: auto with call openings" "$U/v1/chat/completions" "{$G4BASE,$TOOLS4,\"seed\":3,\"logit_bias\":{\"$cid\":6}}"
cp "$T/body" "$T/g4open"
[ "$(jget 'const c=b.choices[0]; c.message.tool_calls===undefined && c.finish_reason!=="tool_calls" && c.message.content.includes("<|tool_call>")')" = true ] \
    && ok || bad "gemma 4: call openings: $(head -c 300 "$T/body")"
curl -s -N -m 60 "$U/v1/chat/completions" -d "{$G4BASE,$TOOLS4,\"seed\":3,\"logit_bias\":{\"$cid\":6},\"stream\":true}" > "$T/sse_g4"
sid=$(grep -m1 -o '"id":"chatcmpl-[0-9a-f]*"' "$T/sse_g4" | cut -d'"' -f4)
a=$(node -e "$SSE" "$T/sse_g4"); b=$(node -e "$BODYKEY" "$T/g4open" "$sid")
[ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "gemma 4: the streamed reply differs from the body: $a vs $b"
# tool_choice "required" and a named function, decoded in Gemma 4's own syntax (tool_pick.c,
# gemma4_args.c): every reply not cut off by max_tokens is calls of declared functions whose arguments
# are valid for their parameters (jsonschema), two calls for some seed (the next call's opening made a
# little likelier), one with parallel_tool_calls false; a named function's call; batched equals alone;
# the records verify; streamed, the same calls
G4R="\"model\":\"g4\",\"messages\":[{\"role\":\"user\",\"content\":\"weather in Rome?\"}],\"max_tokens\":200,\"temperature\":0.9,\"logprobs\":true,\"logit_bias\":{\"$cid\":3}"
required_seeds "gemma 4: required" g4req "$G4R,$RTOOLS,$REQ" "1 2 3 4 5 6" 4
g4multi=$multi
for seed in $g4multi; do
    post 200 "gemma 4: required, parallel off, seed $seed" "$U/v1/chat/completions" "{$G4R,$RTOOLS,$REQ,\"parallel_tool_calls\":false,\"seed\":$seed}"
    v=$("$PY" -c "$RCHECK" "$T/body" "$RTOOLS_A" 2>&1)
    case $v in "1 "*|length) ok ;; *) bad "gemma 4: required, parallel off, seed $seed: $v: $(head -c 400 "$T/body")" ;; esac
done
for seed in 1 2 3 4; do
    post 200 "gemma 4: named, seed $seed" "$U/v1/chat/completions" "{$G4R,$RTOOLS,$FORCE,\"seed\":$seed}"
    cp "$T/body" "$T/g4force$seed"
    v=$("$PY" -c "$RCHECK" "$T/body" "$RTOOLS_A" 2>&1)
    case $v in "1 get_weather"|length) ok ;; *) bad "gemma 4: named, seed $seed: $v: $(head -c 400 "$T/body")" ;; esac
done
same=$(batched_same "$U" g4req "$G4R,$RTOOLS,$REQ")
[ "$same" = 4 ] && ok || bad "gemma 4: required: $same of 4 batched replies equal to the same request alone"
same=$(batched_same "$U" g4force "$G4R,$RTOOLS,$FORCE")
[ "$same" = 4 ] && ok || bad "gemma 4: named: $same of 4 batched replies equal to the same request alone"
for f in g4req1 g4req2 g4force1; do
    node -e 'const b=JSON.parse(require("fs").readFileSync(process.argv[1])); console.log(JSON.stringify(b.verification))' "$T/$f" > "$T/$f.rec"
    post 200 "gemma 4: verify $f" "$U/v1/verify" "@$T/$f.rec"
    [ "$(jget 'b.match')" = true ] && ok || bad "gemma 4: the record of $f does not verify: $(head -c 300 "$T/body")"
done
streamed_two "gemma 4" "$G4R,$RTOOLS,$REQ" g4req "$g4multi"
# refusals naming the field
field_400 "gemma 4: a description that is a list" invalid_value tools "{$G4BASE,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"x\":{\"type\":\"string\",\"description\":[1]}}}}}]}"
# a property without a type (an anyOf, as Pydantic writes Optional) is written, with the empty type
post 200 "gemma 4: a property without a type" "$U/v1/chat/completions" "{$G4BASE,\"max_tokens\":2,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}}}}}]}"
field_400 "gemma 4: a tool message with no call before it" invalid_value messages "{\"model\":\"g4\",\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"tool\",\"content\":\"x\"}],$TOOLS4}"
field_400 "gemma 4: arguments that are no object" invalid_value messages "{\"model\":\"g4\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}],$TOOLS4}"
stop "$LAST_PID" g4
# the batched check can fail: under split-kv-by-batch the four "required" replies at once are not the
# same as alone
start g4faulty g4 --inject split-kv-by-batch --token-delay-ms 2
U=http://127.0.0.1:$PORT
for seed in 1 2 3 4; do curl -s -m 60 -o "$T/g4fault$seed" "$U/v1/chat/completions" -d "{$G4R,$RTOOLS,$REQ,\"seed\":$seed}"; done
same=$(batched_same "$U" g4fault "$G4R,$RTOOLS,$REQ")
[ "$same" -lt 4 ] && ok || bad "gemma 4: under split-kv-by-batch all 4 batched \"required\" replies equal alone: the check cannot fail"
stop "$LAST_PID" g4faulty
finish

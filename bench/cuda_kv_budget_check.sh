#!/usr/bin/env bash
# cuda_kv_budget_check.sh BIN MODEL_DIR [OUT_DIR] — the KV budget of `serve --backend cuda` follows the
# GPU's memory: started without --memory-budget, the server's budget (start-up line and /metrics) must
# be the GPU's free memory less a twentieth of its total, below what nvidia-smi reports free before it
# started; stateful sessions of the model's whole context are then opened until one is refused, which
# must be a 429 memory_budget_exceeded with none failing at creation (a 503: the budget promised more
# than the GPU holds); and a --memory-budget larger than the GPU must be refused at start-up with a
# non-zero status. Prints one summary line ("... PASS" or "... FAIL: why"); exits 1 on failure, 0 with
# "not run" where there is no GPU.
set -u
bin=$1 model=$2 out=${3:-/tmp/kv_budget_check}
mkdir -p "$out"
if ! nvidia-smi -L >/dev/null 2>&1; then echo "kv budget check: not run (no GPU)"; exit 0; fi
fail() { echo "kv budget check: FAIL: $*"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; exit 1; }
read -r total free_before < <(nvidia-smi -i 0 --query-gpu=memory.total,memory.free --format=csv,noheader,nounits | tr -d ',')
rm -f "$out/port"
"$bin" serve -m "$model" --backend cuda --port 0 --port-file "$out/port" --no-request-log --store none \
    --max-sessions 1000 >"$out/serve.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [ -s "$out/port" ] && break; sleep 0.1; done
port=$(cat "$out/port" 2>/dev/null) || fail "the server did not start: $(tail -2 "$out/serve.log")"
line=$(grep -m1 'KV budget' "$out/serve.log")
budget_mib=$(printf '%s\n' "$line" | sed -n 's/.*KV budget \([0-9]*\) MiB.*/\1/p')
printf '%s\n' "$line" | grep -q "default: the GPU's free memory" || fail "start-up line names no GPU default: $line"
metric=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 == "isobatch_kv_budget_bytes" {print $2}')
[ -n "$budget_mib" ] && [ -n "$metric" ] || fail "no budget read (log: $line; metric: $metric)"
[ $((metric >> 20)) -eq "$budget_mib" ] || fail "/metrics says $metric bytes, the log $budget_mib MiB"
# the budget is at most the free memory before start less the reserve, and more than half of it (the
# model is small next to the GPU)
[ "$budget_mib" -le $((free_before - total / 20)) ] || fail "budget $budget_mib MiB > free $free_before - reserve $((total / 20))"
[ "$budget_mib" -gt $((free_before / 2)) ] || fail "budget $budget_mib MiB is not most of the free $free_before MiB"
ctx=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); print(c.get("max_position_embeddings", 4096))' "$model/config.json")
opened=0 refused="" ids=()
for i in $(seq 400); do
    code=$(curl -s -o "$out/sess.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/sessions" \
        -H 'Content-Type: application/json' -d "{\"max_context\": $ctx}")
    if [ "$code" = 200 ] || [ "$code" = 201 ]; then
        opened=$((opened + 1)); ids+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$out/sess.json")")
        continue
    fi
    refused="$code $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["error"]["code"])' "$out/sess.json" 2>/dev/null)"
    break
done
[ "$refused" = "429 memory_budget_exceeded" ] || fail "after $opened sessions of $ctx tokens the refusal was '$refused', not 429 memory_budget_exceeded"
[ "$opened" -ge 1 ] || fail "no session of $ctx tokens was admitted"
for id in "${ids[@]}"; do curl -s -X DELETE "http://127.0.0.1:$port/v1/sessions/$id" >/dev/null; done
kill "$pid"; wait "$pid" 2>/dev/null; pid=
# a budget larger than the GPU: refused at start-up
"$bin" serve -m "$model" --backend cuda --port 0 --port-file "$out/port2" --no-request-log --store none \
    --memory-budget $((total * 2))M >"$out/serve2.log" 2>&1 &
p2=$!
for _ in $(seq 600); do kill -0 "$p2" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$p2" 2>/dev/null; then kill "$p2"; fail "a budget of $((total * 2)) MiB was accepted"; fi
wait "$p2"; rc=$?
[ "$rc" -ne 0 ] && grep -q "more than the cuda backend's device holds" "$out/serve2.log" ||
    fail "a budget of $((total * 2)) MiB: status $rc, $(tail -1 "$out/serve2.log")"
echo "kv budget check: default $budget_mib MiB of a $total MiB GPU ($free_before free before start), $opened sessions of $ctx tokens admitted then 429 memory_budget_exceeded, none failed at creation; a $((total * 2)) MiB budget refused at start-up: PASS"

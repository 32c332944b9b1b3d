#!/usr/bin/env bash
# serve_check.sh BIN BACKEND [OUT_DIR] — the server's invariance on one backend, with curl alone (for
# machines without node): N seeded sampling completions, each sent alone, then all N at once; every
# request's token text and logprobs must be the same both ways. With BACKEND cuda it also compares the
# answers with a CPU server's, and a request of n 4 choices (its prompt prefilled once, the other
# choices copying that session) with the 4 requests of n 1 and seeds seed..seed+3. Scoring: 4 echoed
# prompts (max_tokens 0, logprobs 2) sent alone and again among the N concurrent requests must give the
# same prompt logprobs and alternatives (and with BACKEND cuda the CPU server's). SERVE_ARGS: extra
# flags for the checked server (e.g. --inject gpu-fma, which the comparison with the CPU must catch).
# Prints one summary line; exits 1 on any difference.
set -u
bin=$1 backend=$2 out=${3:-/tmp/serve_check}
n=${N:-16}
mkdir -p "$out"
start() { # start BACKEND TAG -> sets pid, port
    rm -f "$out/port.$2"
    "$bin" serve -m models/default --backend "$1" --port 0 --port-file "$out/port.$2" --max-batch 32 \
        --no-request-log --store none $([ "$2" = main ] && echo "${SERVE_ARGS:-}") >"$out/serve.$2.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do [ -s "$out/port.$2" ] && break; sleep 0.1; done
    port=$(cat "$out/port.$2" 2>/dev/null)
}
ask() { # ask PORT I [SEED [N]] -> the answer's text and logprobs as one line (N choices: one line each)
    curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"default\", \"prompt\": \"And the LORD said unto $2\", \"max_tokens\": 24, \"temperature\": 0.9, \"seed\": ${3:-$2}, \"n\": ${4:-1}, \"logprobs\": 1}" |
        python3 -c 'import json,sys
for c in json.load(sys.stdin)["choices"]: print(json.dumps([c["text"], c["logprobs"]["token_logprobs"]]))'
}
score() { # score PORT I -> an echoed prompt's (max_tokens 0) token logprobs and alternatives as one line
    curl -s "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"default\", \"prompt\": \"And the LORD said unto $2, Behold, the man is become as one of us, to know good and evil\", \"max_tokens\": 0, \"echo\": true, \"logprobs\": 2}" |
        python3 -c 'import json,sys
for c in json.load(sys.stdin)["choices"]: print(json.dumps([c["logprobs"]["token_logprobs"], c["logprobs"]["top_logprobs"]]))'
}
start "$backend" main
for i in $(seq "$n"); do ask "$port" "$i" >"$out/alone.$i"; done
for i in 1 2 3 4; do score "$port" "$i" >"$out/score.alone.$i"; done
for i in $(seq "$n"); do ask "$port" "$i" >"$out/batched.$i" & done
for i in 1 2 3 4; do score "$port" "$i" >"$out/score.batched.$i" & done
wait_pids=$(jobs -p | grep -v "^$pid$"); for p in $wait_pids; do wait "$p"; done
ask "$port" 3 3 4 >"$out/n4"
for k in 0 1 2 3; do ask "$port" 3 $((3 + k)) >>"$out/n4.alone"; done
kill "$pid"; wait "$pid" 2>/dev/null
same=0
for i in $(seq "$n"); do [ -s "$out/alone.$i" ] && cmp -s "$out/alone.$i" "$out/batched.$i" && same=$((same + 1)); done
nsame=$(paste -d'\n' "$out/n4" "$out/n4.alone" | paste - - | awk -F'\t' '$1 != "" && $1 == $2' | wc -l)
ssame=0
for i in 1 2 3 4; do [ -s "$out/score.alone.$i" ] && cmp -s "$out/score.alone.$i" "$out/score.batched.$i" && ssame=$((ssame + 1)); done
line="serve --backend $backend: $same of $n seeded requests bitwise equal alone and among $n concurrent; $nsame of 4 choices of n 4 equal their requests of n 1; $ssame of 4 scored prompts equal alone and among them"
ok=$([ "$same" = "$n" ] && [ "$nsame" = 4 ] && [ "$ssame" = 4 ] && echo 1 || echo 0)
if [ "$backend" != cpu ]; then
    start cpu cpu
    cpu_same=0
    for i in $(seq "$n"); do ask "$port" "$i" >"$out/cpu.$i"; cmp -s "$out/cpu.$i" "$out/alone.$i" && cpu_same=$((cpu_same + 1)); done
    cpu_ssame=0
    for i in 1 2 3 4; do score "$port" "$i" >"$out/cpu.score.$i"; [ -s "$out/cpu.score.$i" ] && cmp -s "$out/cpu.score.$i" "$out/score.alone.$i" && cpu_ssame=$((cpu_ssame + 1)); done
    kill "$pid"; wait "$pid" 2>/dev/null
    line="$line; $cpu_same of $n equal to the CPU server's answers, $cpu_ssame of 4 scored prompts"
    [ "$cpu_same" = "$n" ] && [ "$cpu_ssame" = 4 ] || ok=0
fi
echo "$line"
[ "$ok" = 1 ]

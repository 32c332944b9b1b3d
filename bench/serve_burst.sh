#!/usr/bin/env bash
# serve_burst.sh BIN MODEL BACKEND [ROUNDS] [N] — bursts of N concurrent completions of different prompt
# lengths (each burst's step shapes new, so a GPU server captures new graphs while the burst's requests
# make their KV caches) against one server; counts the HTTP status codes. Prints one line; exits 1
# unless every request got 200.
set -u
bin=${1:?usage: serve_burst.sh BIN MODEL BACKEND [ROUNDS] [N]}
model=$2 backend=$3 rounds=${4:-10} n=${5:-32}
. "$(dirname "$0")/bench_server.sh"
bench_server_up serve_burst "$bin" "$model" "$backend"
: >"$out/codes"
for r in $(seq "$rounds"); do
    pids=""
    for j in $(seq "$n"); do
        words=$((5 + (r * 37 + j * 11) % 120))
        prompt=$(printf 'w%d %.0s' $(seq "$words") | head -c $((words * 3)))
        curl -s -o /dev/null -w '%{http_code}\n' "$U/v1/completions" \
            -d "{\"model\":\"$id\",\"prompt\":\"$prompt $r $j\",\"max_tokens\":$((4 + j % 13)),\"temperature\":0.7,\"seed\":$j}" >>"$out/codes" &
        pids="$pids $!"
    done
    wait $pids
done
summary=$(sort "$out/codes" | uniq -c | awk '{printf "%s%s x %s", (NR > 1 ? ", " : ""), $1, $2}')
echo "serve_burst --backend $backend: $rounds bursts of $n concurrent requests: $summary"
[ "$(grep -vc '^200$' "$out/codes")" = 0 ]

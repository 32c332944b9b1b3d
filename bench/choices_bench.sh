#!/usr/bin/env bash
# choices_bench.sh BIN MODEL BACKEND [N] [PROMPT_WORDS] [ROUNDS] — what prefilling a prompt once for n
# choices saves: one completions request of n N (choice j sampled with seed + j; choices past the
# first copy the first one's prefilled session) against N concurrent requests of n 1 with seeds
# seed..seed+N-1 (what a client without n sends), on one server, ROUNDS rounds alternating. Prints each
# round's wall seconds, the medians, the prompt tokens the server shared (isobatch_tokens_shared_total;
# the concurrent requests share their common prompt too unless EXTRA="--share-prefix 0") and whether
# every choice equals its request of n 1 bitwise (text and logprobs). Exits 1 on a difference. EXTRA:
# more serve flags.
set -u
bin=${1:?usage: choices_bench.sh BIN MODEL BACKEND [N] [PROMPT_WORDS] [ROUNDS]}
model=$2 backend=$3 n=${4:-8} words=${5:-250} rounds=${6:-3}
. "$(dirname "$0")/bench_server.sh"
bench_server_up choices_bench "$bin" "$model" "$backend" ${EXTRA:-}
prompt=$(python3 -c "import sys; print(' '.join('word%d' % (i % 97) for i in range(int(sys.argv[1]))))" "$words")
body() { # body SEED N
    printf '{"model":"%s","prompt":"%s","max_tokens":32,"temperature":0.8,"seed":%d,"n":%d,"logprobs":1}' "$id" "$prompt" "$1" "$2"
}
lines() { python3 -c 'import json,sys
b = json.load(open(sys.argv[1]))
if "choices" not in b: sys.exit("choices_bench: " + json.dumps(b)[:300])
for c in b["choices"]: print(json.dumps([c["text"], c["logprobs"]["token_logprobs"]]))' "$1"; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
shared() { curl -s "$U/metrics" | sed -n 's/^isobatch_tokens_shared_total //p'; }
curl -s -o /dev/null "$U/v1/completions" -d "$(body 1 1)"   # warm up
same_all=1
for r in $(seq "$rounds"); do
    seed=$((100 * r))
    s0=$(shared)
    t0=$(date +%s.%N)
    curl -s -o "$out/n.$r" "$U/v1/completions" -d "$(body $seed "$n")"
    t1=$(date +%s.%N)
    s1=$(shared)
    for j in $(seq 0 $((n - 1))); do curl -s -o "$out/one.$r.$j" "$U/v1/completions" -d "$(body $((seed + j)) 1)" & done
    wait $(jobs -p | grep -v "^$pid$")
    t2=$(date +%s.%N)
    s2=$(shared)
    lines "$out/n.$r" >"$out/n.$r.lines"
    : >"$out/one.$r.lines"
    for j in $(seq 0 $((n - 1))); do lines "$out/one.$r.$j" >>"$out/one.$r.lines"; done
    cmp -s "$out/n.$r.lines" "$out/one.$r.lines" && [ "$(wc -l <"$out/n.$r.lines")" = "$n" ] && same=yes || { same=NO; same_all=0; }
    printf 'round %d: n %d in one request %.3f s (%s prompt tokens shared); %d concurrent requests of n 1 %.3f s (%s shared); choices equal: %s\n' \
        "$r" "$n" "$(sub "$t1" "$t0")" "$((s1 - s0))" "$n" "$(sub "$t2" "$t1")" "$((s2 - s1))" "$same"
    echo "$(sub "$t1" "$t0") $(sub "$t2" "$t1")" >>"$out/times"
done
python3 - "$out/times" "$backend" "$n" "$words" "${EXTRA:-}" <<'EOF'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
a, b = statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)
print(f"choices_bench --backend {sys.argv[2]} {sys.argv[5]}, n {sys.argv[3]}, a prompt of {sys.argv[4]} words: median "
      f"{a:.3f} s as one request of n {sys.argv[3]}, {b:.3f} s as {sys.argv[3]} requests ({b / a:.2f}x)")
EOF
[ "$same_all" = 1 ]

#!/usr/bin/env bash
# ab_bench.sh BIN MODEL_DIR ROUNDS SETTING... -- BENCH_ARGS...
# One A/B measurement in one run: `BIN bench -m MODEL_DIR BENCH_ARGS` under each SETTING in turn (a
# space-separated list of VAR=VALUE environment settings; "" for none), the whole list ROUNDS times, so
# that clock, temperature and neighbours' load drift over all settings alike. Prints, per setting and
# batch size, the decode tok/s of every round and their median, and the prefill tok/s; then, for each
# setting after the first, the median over rounds of its figure over the first setting's in the same
# round (a paired comparison, which the machine's drift between rounds does not move; the settings run
# in the same order every round, so a drift within rounds still favours one side: run it again with the
# settings swapped before believing a few percent). A setting's word
# BIN=PATH runs the binary at PATH instead of BIN (two builds alternated: "" "BIN=base/isobatch"). The figures in
# docs/cuda.md ("alternating in one call, two rounds") are taken this way, e.g.
#   bench/ab_bench.sh build/isobatch /tmp/q06 2 "" "IB_CUDA_ATT_WIDE=0" -- --backend cuda --batch 1,2,4
#       --prompt 128 --gen 32 --reps 3 --kv-dtype f16
set -u
usage() { echo "usage: ab_bench.sh BIN MODEL_DIR ROUNDS SETTING... -- BENCH_ARGS..." >&2; exit 2; }
[ $# -ge 5 ] || usage
bin=$1 model=$2 rounds=$3
shift 3
case $rounds in '' | *[!0-9]* | 0) echo "ab_bench.sh: ROUNDS must be a positive integer, not '$rounds'" >&2; exit 2 ;; esac
settings=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do settings+=("$1"); shift; done
[ $# -gt 0 ] || usage
shift
[ ${#settings[@]} -ge 1 ] || usage
for s in "${settings[@]}"; do
    for kv in $s; do
        case $kv in [A-Za-z_]*=*) ;; *) echo "ab_bench.sh: setting '$s': '$kv' is not VAR=VALUE" >&2; exit 2 ;; esac
    done
done
for b in "$bin" $(printf '%s\n' "${settings[@]}" | tr ' ' '\n' | sed -n 's/^BIN=//p'); do
    [ -x "$b" ] || { echo "ab_bench.sh: $b is not an executable" >&2; exit 2; }
done
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
    for i in "${!settings[@]}"; do
        run=$bin envs=()
        for kv in ${settings[$i]}; do
            case $kv in BIN=*) run=${kv#BIN=} ;; *) envs+=("$kv") ;; esac
        done
        if ! env "${envs[@]}" "$run" bench -m "$model" "$@" >"$tmp/out" 2>&1; then
            echo "ab_bench.sh: bench failed under '${settings[$i]}' (round $r):" >&2
            tail -3 "$tmp/out" >&2
            exit 1
        fi
        awk -v s="$i" -v r="$r" '/^ +[0-9]+ +[0-9.]+ /{print s, r, $1, $2} /^prefill [0-9]+ tokens:/{print s, r, "prefill", $4}' \
            "$tmp/out" >>"$tmp/rows"
    done
done
for i in "${!settings[@]}"; do
    name=${settings[$i]:-"(none)"}
    awk -v s="$i" -v n="$name" '
        $1 == s { key = $3; v[key] = v[key] (v[key] == "" ? "" : " ") $4; c[key]++; if (!(key in seen)) { seen[key] = 1; order[++k] = key } }
        END {
            for (j = 1; j <= k; j++) {
                key = order[j]; m = split(v[key], a, " ");
                for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] + 0 < a[x] + 0) { t = a[x]; a[x] = a[y]; a[y] = t }
                med = m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2;
                printf "%-36s %-8s %s  (median %s)\n", n, key == "prefill" ? "prefill" : "B=" key, v[key], med
            }
        }' "$tmp/rows"
done
# Paired within rounds (the machine's drift cancels): each setting after the first against the first,
# per round the ratio of their figures, then the median ratio and in how many rounds it was above 1.
[ ${#settings[@]} -lt 2 ] || awk -v n0="${settings[0]:-(none)}" -v names="$(printf '%s\n' "${settings[@]}" | sed 's/^$/(none)/' | paste -sd'|')" '
    { val[$1, $2, $3] = $4; if (!($3 in seen)) { seen[$3] = 1; order[++k] = $3 } if ($2 > R) R = $2; if ($1 > S) S = $1 }
    END {
        split(names, nm, "|")
        for (s = 1; s <= S; s++)
            for (j = 1; j <= k; j++) {
                key = order[j]; m = 0; up = 0
                for (r = 1; r <= R; r++)
                    if (((0, r, key) in val) && ((s, r, key) in val) && val[0, r, key] > 0) {
                        q[++m] = val[s, r, key] / val[0, r, key]; if (q[m] > 1) up++
                    }
                if (m == 0) continue
                for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (q[y] < q[x]) { t = q[x]; q[x] = q[y]; q[y] = t }
                med = m % 2 ? q[(m + 1) / 2] : (q[m / 2] + q[m / 2 + 1]) / 2
                printf "paired: %-28s %-8s %.3fx of %s (median of %d rounds; higher in %d of them)\n", nm[s + 1],
                       key == "prefill" ? "prefill" : "B=" key, med, n0, m, up
            }
    }' "$tmp/rows"

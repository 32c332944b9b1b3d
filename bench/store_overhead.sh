#!/usr/bin/env bash
# store_overhead.sh — what the session store costs (prints numbers, asserts nothing):
#   1. 128 clients (bench/loadgen.js --conversations: a session each, append + generate in turn) for
#      SECONDS against `isobatch serve` with no store, the SQLite store (--data-dir) and the PostgreSQL
#      store (a private server, tests/pg_server.sh): tokens/s and turn latency, side by side;
#   2. one session holding N tokens: the time of a 1-token generation while resident, and after a
#      restart (its KV rebuilt by prefill from the store first), median of REPS.
# Usage: bash bench/store_overhead.sh [MODEL_DIR (models/default)] [SECONDS (20)] [N (2000)] [REPS (3)]
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/build/isobatch
MODEL=${1:-$ROOT/models/default}; SECONDS_=${2:-20}; N=${3:-2000}; REPS=${4:-3}
T=$(mktemp -d /tmp/ib_store_bench_XXXXXX); P=$(mktemp -d /tmp/ib_store_bench_pg_XXXXXX)
. "$ROOT/tests/pg_server.sh"
SP=""
trap '[ -n "$SP" ] && kill $SP 2>/dev/null; pg_cleanup; rm -rf "$T" "$P"' EXIT
pg_start "$P" >/dev/null
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
serve() { # serve ARGS...: start a server on $PORT, wait until it answers
    PORT=$(port)
    "$BIN" serve -m "$MODEL" --port "$PORT" --threads 2 --no-request-log --max-batch 128 --max-queue 512 "$@" 2>>"$T/serve.log" &
    SP=$!
    for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null && return; sleep 0.05; done
    echo "store_overhead: the server did not start" >&2; exit 1
}
stop() { kill -TERM "$SP"; wait "$SP" 2>/dev/null || true; SP=""; }
NAME=$(basename "$MODEL")
echo "model $MODEL; $(nproc) CPUs; $(date -u +%FT%TZ)"
echo "== 128 clients, a session each (append 32 characters, generate 16 tokens), ${SECONDS_} s"
for store in none "sqlite:$T/s.db" "$PG_URI"; do
    serve --store "$store"
    printf '%-12s ' "$(echo "$store" | cut -d: -f1)"
    node "$ROOT/bench/loadgen.js" --url "http://127.0.0.1:$PORT" --model "$NAME" --clients 128 --seconds "$SECONDS_" \
        --conversations --prompt-tokens 32 --max-tokens 16
    stop
done
echo "== one session of $N tokens: a 1-token generation resident vs rebuilt from the store (median of $REPS)"
ids=$(python3 -c "print(','.join(str((i * 37) % 200 + 1) for i in range($N)))")
for store in "sqlite:$T/r.db" "$PG_URI"; do
    res=(); reb=()
    for r in $(seq 1 "$REPS"); do
        serve --store "$store"
        U=http://127.0.0.1:$PORT
        sid=$(curl -s "$U/v1/sessions" -d "{\"max_context\":$((N + 32))}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
        code=$(curl -s -o "$T/a" -w '%{http_code}' "$U/v1/sessions/$sid/append" -d "{\"tokens\":[$ids]}")
        [ "$code" = 200 ] || { echo "store_overhead: append of $N tokens: HTTP $code $(head -c 300 "$T/a")" >&2; exit 1; }
        curl -s "$U/v1/sessions/$sid/generate" -d '{"max_tokens":1,"temperature":0}' >/dev/null   # prefill N
        curl -s "$U/v1/sessions/$sid/append" -d '{"tokens":[5]}' >/dev/null
        res+=("$(curl -s -o /dev/null -w '%{time_total}' "$U/v1/sessions/$sid/generate" -d '{"max_tokens":1,"temperature":0}')")
        stop; serve --store "$store"; U=http://127.0.0.1:$PORT
        curl -s "$U/v1/sessions/$sid/append" -d '{"tokens":[6]}' >/dev/null
        reb+=("$(curl -s -o "$T/g" -w '%{time_total}' "$U/v1/sessions/$sid/generate" -d '{"max_tokens":1,"temperature":0}')")
        grep -q '"completion_tokens":1' "$T/g" || { echo "store_overhead: the rebuilt generation: $(head -c 300 "$T/g")" >&2; exit 1; }
        curl -s -X DELETE "$U/v1/sessions/$sid" >/dev/null; stop
    done
    med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    printf '%-12s resident %.3f s, rebuilt %.3f s (all: %s | %s)\n' "$(echo "$store" | cut -d: -f1)" \
        "$(med "${res[@]}")" "$(med "${reb[@]}")" "${res[*]}" "${reb[*]}"
done

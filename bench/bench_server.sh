# bench_server.sh — sourced by the bench scripts that talk to a server (choices_bench.sh, serve_burst.sh).
# bench_server_up NAME BIN MODEL BACKEND [SERVE_FLAGS...]: a temporary folder $out (removed at exit), the
# server started there on a free port (--max-batch 64, no request log, no store) and stopped at exit;
# sets pid, U (its URL) and id (the model name requests use). Exits 1 when it does not start.
bench_server_up() {
    local name=$1 bin=$2 model=$3 backend=$4 port
    shift 4
    out=$(mktemp -d "/tmp/$name.XXXXXX")
    trap 'kill "$pid" 2>/dev/null; rm -rf "$out"' EXIT
    "$bin" serve -m "$model" --backend "$backend" --port 0 --port-file "$out/port" --max-batch 64 \
        --no-request-log --store none "$@" >"$out/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do [ -s "$out/port" ] && break; sleep 0.1; done
    port=$(cat "$out/port" 2>/dev/null)
    [ -n "$port" ] || { echo "$name: the server did not start"; cat "$out/serve.log"; exit 1; }
    U=http://127.0.0.1:$port
    id=$(curl -s "$U/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
}

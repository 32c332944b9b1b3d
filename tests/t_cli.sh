#!/usr/bin/env bash
# CLI tests: the isobatch tool end to end on a tiny synthetic model — invariance through the CLI
# (12 prompts: every --batch, --threads, --prefill-chunk and --isa of the contract, reversed order,
# greedy and seeded, each comparison failing under --inject), --json fields, bench --profile, --logits-out, the
# --check-serial verdict under every batch fault, the mkmodel presets and weight formats, and every bad
# input: a one-line error naming what was wrong, a non-zero exit, no crash. Bad inputs run under the
# ASan/UBSan build.
set -u
. "$(dirname "$0")/cli_bins.sh"
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
# the bad inputs must run under the sanitizers: without that build they still run, and the test fails
[ -x "$ASAN_BIN" ] || { bad "$ASAN_BIN missing (run make asan): bad inputs run without ASan/UBSan"; ASAN_BIN=$BIN; }
T=$(mktemp -d /tmp/ib_cli_XXXXXX)
trap 'rm -rf "$T"' EXIT

"$BIN" mkmodel --preset tiny --seed 3 --bits 4 --out "$T/m" >/dev/null || bad "mkmodel"
"$BIN" info -m "$T/m" | grep -q "architecture qwen3" && ok || bad "info"
"$BIN" info -m "$T/m" --json | grep -q '"quant_bits":4' && ok || bad "info --json"
# info --kv-dtype: q8 takes 36 bytes for every 32 elements, f32 128
kv32=$("$BIN" info -m "$T/m" --json | grep -o '"kv_bytes_per_token":[0-9]*' | cut -d: -f2)
kvq8=$("$BIN" info -m "$T/m" --json --kv-dtype q8 | grep -o '"kv_bytes_per_token":[0-9]*' | cut -d: -f2)
[ -n "$kv32" ] && [ -n "$kvq8" ] && [ $((kvq8 * 128)) = $((kv32 * 36)) ] && ok || bad "info --kv-dtype q8: $kvq8 bytes a token against f32's $kv32"

# invariance through the CLI: every line of --json output identical across batch/threads/chunk/isa
P=(-p "Hello" -p "The quick brown fox jumps over the lazy dog" -p "a" -p "1234567890 1234567890 1234567890"
   -p "batched decoding must not change answers" -p "xyz xyz xyz xyz xyz xyz xyz xyz xyz xyz xyz xyz")
"$BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --json --batch 1 --threads 1 --isa scalar > "$T/ref" 2>/dev/null \
    && [ "$(wc -l < "$T/ref")" = 6 ] && ok || bad "generate reference"
for flags in "--batch 3" "--batch 6 --threads 2" "--batch 4 --prefill-chunk 1" "--batch 2 --prefill-chunk 5 --threads 3" "--isa auto --batch 5"; do
    # shellcheck disable=SC2086
    "$BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --json $flags > "$T/out" 2>/dev/null
    cmp -s "$T/ref" "$T/out" && ok || bad "generate $flags differs from --batch 1"
done
"$BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --temp 0.8 --top-k 40 --top-p 0.9 --seed 5 --json --batch 1 > "$T/s1" 2>/dev/null
"$BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --temp 0.8 --top-k 40 --top-p 0.9 --seed 5 --json --batch 6 > "$T/s6" 2>/dev/null
cmp -s "$T/s1" "$T/s6" && ok || bad "seeded sampling differs between batch 1 and 6"
cmp -s "$T/s1" "$T/ref" && bad "sampling gave the greedy output" || ok

# the full matrix through the CLI: 12 prompts of 1 to 150 tokens (one per line), every --json line
# (tokens, text, digest) equal to the serialized scalar run for --batch 2 3 5 8 16, --threads 1-4,
# --prefill-chunk 1 7 64 whole, every --isa this CPU has, and the prompts in reverse order; greedy and
# seeded sampling. Then each kind of comparison, both of its runs under --inject, must fail.
PF=$T/prompts12.txt; : > "$PF"
for i in $(seq 0 11); do
    len=$(( 1 + (i * 53) % 150 ))
    printf 'The %d quick brown foxes jump over %d lazy dogs; batching must not change answers. ' "$i" "$((i * 7))" \
        | head -c "$len" | tr '\n' ' ' >> "$PF"; echo >> "$PF"
done
tac "$PF" > "$T/prompts12.rev"
gen12() { "$BIN" generate -m "$T/m" --prompts-file "$PF" -n 8 --ignore-eos --json "$@" 2>"$T/gen12.err"; }
unindex() { sed -E 's/^\{"index":[0-9]+,/{/' "$@"; }
SAMPLING=(--temp 0.9 --top-k 50 --top-p 0.95 --min-p 0.01 --repeat-penalty 1.1 --seed 7)
for mode in greedy seeded; do
    S=(); [ $mode = seeded ] && S=("${SAMPLING[@]}")
    gen12 --batch 1 --threads 1 --isa scalar "${S[@]}" > "$T/ref12" && [ "$(wc -l < "$T/ref12")" = 12 ] \
        && ok || bad "$mode: 12-prompt reference run"
    for flags in "--batch 2" "--batch 3" "--batch 5" "--batch 8" "--batch 16" \
                 "--batch 5 --threads 1" "--batch 5 --threads 2" "--batch 5 --threads 3" "--batch 5 --threads 4" \
                 "--batch 3 --prefill-chunk 1" "--batch 3 --prefill-chunk 7" "--batch 3 --prefill-chunk 64" \
                 "--batch 3 --prefill-chunk whole" "--batch 1 --prefill-chunk 7"; do
        # shellcheck disable=SC2086
        gen12 $flags "${S[@]}" > "$T/out12"
        cmp -s "$T/ref12" "$T/out12" && ok || bad "$mode: generate $flags differs from --batch 1 --threads 1 --isa scalar"
    done
    for isa in scalar avx2 avx512 neon amx; do
        if gen12 --batch 4 --threads 2 --isa $isa "${S[@]}" > "$T/out12"; then
            cmp -s "$T/ref12" "$T/out12" && ok || bad "$mode: --isa $isa differs from scalar"
        elif grep -q "not supported" "$T/gen12.err"; then
            echo "t_cli: --isa $isa not supported here: skipped"
        else
            bad "$mode: --isa $isa failed: $(cat "$T/gen12.err")"
        fi
    done
    "$BIN" generate -m "$T/m" --prompts-file "$T/prompts12.rev" -n 8 --ignore-eos --json --batch 8 "${S[@]}" 2>/dev/null \
        | tac | unindex > "$T/out12"
    unindex "$T/ref12" | cmp -s - "$T/out12" && ok || bad "$mode: reversed prompt order changes answers"
done
cmp -s "$T/ref12" <(gen12 --batch 1 --threads 1 --isa scalar) && bad "seeded sampling gave the greedy output" || ok

# each comparison above fails when both of its runs carry a fault (faults of the kind that break it)
fault_breaks() {   # fault_breaks FAULT "REFERENCE FLAGS" "VARIATION FLAGS" [reversed]
    local f=$1 rf=$2 vf=$3
    # shellcheck disable=SC2086
    gen12 --inject "$f" $rf > "$T/fref" || { bad "--inject $f: reference run failed: $(cat "$T/gen12.err")"; return; }
    if [ "${4:-}" = reversed ]; then
        # shellcheck disable=SC2086
        "$BIN" generate -m "$T/m" --prompts-file "$T/prompts12.rev" -n 8 --ignore-eos --json --inject "$f" $vf 2>/dev/null \
            | tac | unindex > "$T/fout"
        unindex "$T/fref" > "$T/fref2"; mv "$T/fref2" "$T/fref"
    else
        # shellcheck disable=SC2086
        gen12 --inject "$f" $vf > "$T/fout"
    fi
    [ -s "$T/fout" ] && ! cmp -s "$T/fref" "$T/fout" && ok || bad "--inject $f: '$vf' still equals '$rf'"
}
REF1="--batch 1 --threads 1 --isa scalar"
for f in rope-scalar-offset rope-skip-rows gemv-gemm split-kv-by-batch; do fault_breaks $f "$REF1" "--batch 8"; done
fault_breaks split-k-threads "$REF1" "--batch 1 --threads 3 --isa scalar"
fault_breaks row-order "$REF1" "--batch 8" reversed
fault_breaks gemv-gemm "$REF1" "--batch 1 --threads 1 --isa scalar --prefill-chunk 1"
fault_breaks shared-rng "$REF1 ${SAMPLING[*]}" "--batch 8 ${SAMPLING[*]}"
for isa in avx2 avx512 neon; do
    gen12 --isa $isa -n 1 > /dev/null 2>&1 || continue
    for act in q8 f32; do fault_breaks isa-fma "$REF1 --act $act" "--batch 1 --threads 1 --isa $isa --act $act"; done
done
# --check-serial (batched against each prompt alone, in one command) under each batch fault
for f in rope-scalar-offset rope-skip-rows gemv-gemm split-kv-by-batch row-order; do
    "$BIN" generate -m "$T/m" --prompts-file "$PF" -n 8 --ignore-eos --batch 8 --check-serial --inject $f > "$T/cs" 2>&1; rc=$?
    [ $rc = 1 ] && grep -q "differs from its serialized run" "$T/cs" && ok || bad "--check-serial --inject $f: exit $rc"
done

# --json: every field, the digest as 16 hex digits
for k in '"index":0,' '"prompt_tokens":' '"tokens":[' '"text":"' '"finish_reason":"length"' '"digest":"'; do
    head -1 "$T/ref12" | grep -qF -- "$k" && ok || bad "--json lacks $k: $(head -1 "$T/ref12")"
done
grep -qE '"digest":"[0-9a-f]{16}"' "$T/ref12" && ok || bad "--json digest is not 16 hex digits"

# the sanitizer build (-O1, baseline-ISA elementwise ops without AVX2 clones) gives the same bits
if [ "$ASAN_BIN" != "$BIN" ]; then
    "$ASAN_BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --json --batch 3 > "$T/asan" 2>/dev/null
    cmp -s "$T/ref" "$T/asan" && ok || bad "the ASan/no-clones build differs from the optimized build"
fi

# --logits-out: prompt-major float32 rows, 6 prompts x 10 rows x vocab 320
"$BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --batch 4 --logits-out "$T/logits.bin" >/dev/null 2>&1
[ "$(stat -c %s "$T/logits.bin")" = $((6*10*320*4)) ] && ok || bad "--logits-out size"
"$BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --batch 1 --threads 1 --isa scalar --logits-out "$T/logits1.bin" >/dev/null 2>&1
cmp -s "$T/logits.bin" "$T/logits1.bin" && ok || bad "--logits-out: batch 4 rows differ from batch 1 rows"
"$BIN" generate -m "$T/m" "${P[@]}" -n 10 --ignore-eos --batch 4 --logits-out "$T/logits_f.bin" --inject rope-skip-rows >/dev/null 2>&1
cmp -s "$T/logits.bin" "$T/logits_f.bin" && bad "--logits-out: rope-skip-rows left the rows unchanged" || ok

# --check-serial passes clean and fails under a fault
"$BIN" generate -m "$T/m" "${P[@]}" -n 8 --batch 6 --check-serial > "$T/cs" 2>&1 \
    && grep -q "6 of 6 prompts bitwise identical" "$T/cs" && ok || bad "--check-serial clean"
"$BIN" generate -m "$T/m" "${P[@]}" -n 8 --batch 6 --check-serial --inject rope-scalar-offset > "$T/cs" 2>&1 \
    && bad "--check-serial passed under rope-scalar-offset" || ok
grep -q "differs from its serialized run" "$T/cs" && ok || bad "--check-serial did not name the differing prompt"
# a sink + window KV policy shorter than the prompts: batched, chunked runs equal the prompts alone, the
# answers differ from the full cache's, and a batch fault is caught
"$BIN" generate -m "$T/m" "${P[@]}" -n 12 --ignore-eos --batch 6 --prefill-chunk 3 --kv sink:2,window:6 --check-serial \
    --json > "$T/win" 2> "$T/cs" && grep -q "6 of 6 prompts bitwise identical" "$T/cs" && ok || bad "--kv sink:2,window:6 --check-serial"
"$BIN" generate -m "$T/m" "${P[@]}" -n 12 --ignore-eos --batch 6 --json > "$T/full" 2>/dev/null
cmp -s "$T/win" "$T/full" && bad "--kv sink:2,window:6 gave the full cache's answers" || ok
"$BIN" generate -m "$T/m" "${P[@]}" -n 12 --ignore-eos --batch 6 --prefill-chunk 3 --kv sink:2,window:6 --check-serial \
    --inject split-kv-by-batch > "$T/cs" 2>&1 && bad "--kv window --check-serial passed under split-kv-by-batch" || ok

# the embedding example: two sessions stepped together equal each alone
if [ -x "$BUILD/examples/two_sessions" ]; then
    [ "$("$BUILD/examples/two_sessions" "$T/m" | grep -c "identical to decoding alone")" = 2 ] && ok || bad "examples/two_sessions"
else
    bad "examples/two_sessions not built"
fi

# the benchmark preset: Qwen3-0.6B's shapes (written, checked by info, removed)
if "$BIN" mkmodel --preset qwen3-0.6b --out "$T/q06" > /dev/null; then
    "$BIN" info -m "$T/q06" --json > "$T/q06.json"
    for k in '"arch":"qwen3"' '"vocab_size":151936' '"hidden_size":1024' '"layers":28' '"heads":16' '"kv_heads":8' \
             '"head_dim":128' '"intermediate_size":3072' '"tied_embeddings":true' '"quant_bits":4' '"quant_group":64'; do
        grep -qF -- "$k" "$T/q06.json" && ok || bad "mkmodel qwen3-0.6b: info lacks $k: $(cat "$T/q06.json")"
    done
else
    bad "mkmodel --preset qwen3-0.6b"
fi
rm -rf "$T/q06"

# bench --json: every field, one entry per batch, one per repetition, and the figures consistent with
# each other (median inside min..max, 'of floor' the median tok/s over the floor, each repetition's
# own ratio its tok/s over the floor at the bandwidth measured around it)
if "$BIN" bench -m "$T/m" --batch 1,3 --prompt 8 --gen 4 --threads 2 --reps 3 --json > "$T/bench.json" 2>"$T/bench.err"; then
    node -e '
const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const bad = [];
for (const k of ["read_bandwidth_gbs", "weight_bytes", "kv_bytes_per_token", "peak_rss_mb"])
  if (!(r[k] > 0)) bad.push(k);
if (!(r.read_bandwidth_all_gbs && r.read_bandwidth_all_gbs.passes === 5 + 2 * 3 * 4)) bad.push("read_bandwidth_all_gbs.passes");
if (!(r.prefill_tok_s.median > 0 && r.prefill_tok_s.tokens === 8 && r.prefill_tok_s.first_step > 0)) bad.push("prefill_tok_s");
if (r.decode.length !== 2 || r.decode[0].batch !== 1 || r.decode[1].batch !== 3) bad.push("decode batches");
const med = v => { const s = [...v].sort((a, b) => a - b); return s[(s.length - 1) / 2]; };
const pr = r.prefill_tok_s.reps || [], ps = r.prefill_tok_s;
if (pr.length !== 3 || Math.abs(Math.min(...pr) - ps.min) > 1e-9 * ps.min || Math.abs(Math.max(...pr) - ps.max) > 1e-9 * ps.max
    || Math.abs(med(pr) - ps.median) > 1e-9 * ps.median) bad.push("prefill_tok_s.reps");
for (const d of r.decode) {
  if (!(d.min <= d.tok_s && d.tok_s <= d.max && d.ms_per_step > 0 && d.floor_tok_s > 0)) bad.push("decode figures B=" + d.batch);
  if (d.reps.length !== 3) { bad.push("reps B=" + d.batch); continue; }
  if (Math.abs(d.tok_s / d.floor_tok_s - d.fraction_of_floor) > 1e-9 * d.fraction_of_floor) bad.push("fraction B=" + d.batch);
  if (Math.abs(med(d.reps.map(x => x.tok_s)) - d.tok_s) > 1e-9 * d.tok_s) bad.push("tok_s median B=" + d.batch);
  const stepBytes = r.weight_bytes + d.batch * (8 + 4 / 2) * r.kv_bytes_per_token;
  if (Math.abs(stepBytes / (d.batch / d.tok_s) / 1e9 - d.read_gbs) > 1e-9 * d.read_gbs) bad.push("read_gbs B=" + d.batch);
  for (const x of d.reps) {
    const floor = d.batch / (stepBytes / (x.read_bandwidth_gbs * 1e9));
    if (!(x.read_bandwidth_gbs > 0) || Math.abs(x.tok_s / floor - x.fraction_of_floor) > 1e-9 * x.fraction_of_floor) bad.push("rep fraction B=" + d.batch);
  }
}
if (bad.length) { console.log(bad.join(" ")); process.exit(1); }' "$T/bench.json" && ok || bad "bench --json: $(cat "$T/bench.json")"
else
    bad "bench --json failed: $(cat "$T/bench.err")"
fi
"$BIN" bench -m "$T/m" --batch 2 --prompt 4 --gen 2 --threads 1 --reps 1 > "$T/bench.txt" 2>&1 \
    && grep -q "^read bandwidth over all 11 passes" "$T/bench.txt" && grep -qE '^ +2 ' "$T/bench.txt" && ok \
    || bad "bench text output: $(cat "$T/bench.txt")"
"$BIN" bench -m "$T/m" --batch 1,2 --prompt 12 --gen 6 --threads 2 --reps 2 --kv sink:2,window:8 --kv-dtype f16 \
    > "$T/bench.txt" 2>&1 && grep -q "(f16, kv sink:2,window:8)" "$T/bench.txt" && grep -qE '^ +2 ' "$T/bench.txt" && ok \
    || bad "bench --kv sink:2,window:8: $(cat "$T/bench.txt")"

# bench/ab_bench.sh: every setting x batch (and prefill) with one figure per round and their median; a
# setting that is not VAR=VALUE, no rounds, or a failing bench: a message and a non-zero exit
bash bench/ab_bench.sh "$BIN" "$T/m" 2 "" "IB_AB_PROBE=1 IB_AB_PROBE2=2" -- --batch 1,2 --prompt 4 --gen 2 --threads 1 --reps 1 \
    > "$T/ab.txt" 2> "$T/ab.err"
[ $? = 0 ] && [ "$(grep -cE '^\(none\) +(B=1|B=2|prefill) +[0-9.]+ [0-9.]+  \(median [0-9.]+\)$' "$T/ab.txt")" = 3 ] \
    && [ "$(grep -cE '^IB_AB_PROBE=1 IB_AB_PROBE2=2 +(B=1|B=2|prefill) +[0-9.]+ [0-9.]+  \(median [0-9.]+\)$' "$T/ab.txt")" = 3 ] \
    && ok || bad "ab_bench.sh: $(cat "$T/ab.txt" "$T/ab.err")"
# its paired lines: per figure, the median over rounds of the second setting's over the first's in the
# same round, and the rounds where it was higher, recomputed here from the per-round figures it printed
python3 - "$T/ab.txt" > "$T/ab.check" 2>&1 <<'PY'
import re, sys
rows, paired = {}, {}
for line in open(sys.argv[1]):
    m = re.match(r'^(\(none\)|IB_AB_PROBE=1 IB_AB_PROBE2=2) +(B=\d+|prefill) +([0-9. ]+?)  \(median', line)
    if m: rows[(m.group(1), m.group(2))] = [float(x) for x in m.group(3).split()]
    m = re.match(r'^paired: IB_AB_PROBE=1 IB_AB_PROBE2=2 +(B=\d+|prefill) +([0-9.]+)x of \(none\) \(median of (\d+) rounds; higher in (\d+) of them\)$', line)
    if m: paired[m.group(1)] = (float(m.group(2)), int(m.group(3)), int(m.group(4)))
bad = []
for key in ('B=1', 'B=2', 'prefill'):
    a, b = rows.get(('(none)', key)), rows.get(('IB_AB_PROBE=1 IB_AB_PROBE2=2', key))
    if not a or not b or key not in paired: bad.append(key + ': missing'); continue
    q = sorted(y / x for x, y in zip(a, b))
    med = q[len(q) // 2] if len(q) % 2 else (q[len(q) // 2 - 1] + q[len(q) // 2]) / 2
    want = (round(med, 3), len(q), sum(1 for x in q if x > 1))
    got = paired[key]
    if abs(got[0] - want[0]) > 0.0015 or got[1:] != want[1:]: bad.append('%s: printed %s, want %s' % (key, got, want))
print('ok' if not bad else '; '.join(bad))
PY
[ "$(cat "$T/ab.check")" = ok ] && ok || bad "ab_bench.sh paired lines: $(cat "$T/ab.check") $(grep paired "$T/ab.txt")"
bash bench/ab_bench.sh "$BIN" "$T/m" 1 "NOTASETTING" -- --batch 1 > /dev/null 2> "$T/ab.err"; rc=$?
[ $rc = 2 ] && grep -q "'NOTASETTING' is not VAR=VALUE" "$T/ab.err" && ok || bad "ab_bench.sh bad setting: exit $rc, $(cat "$T/ab.err")"
bash bench/ab_bench.sh "$BIN" "$T/m" 0 "" -- --batch 1 > /dev/null 2> "$T/ab.err"; rc=$?
[ $rc = 2 ] && grep -q "ROUNDS must be a positive integer" "$T/ab.err" && ok || bad "ab_bench.sh 0 rounds: exit $rc, $(cat "$T/ab.err")"
bash bench/ab_bench.sh "$BIN" "$T/nope" 1 "" -- --batch 1 > /dev/null 2> "$T/ab.err"; rc=$?
[ $rc = 1 ] && grep -q "bench failed under ''" "$T/ab.err" && ok || bad "ab_bench.sh failing bench: exit $rc, $(cat "$T/ab.err")"
# a setting's BIN=PATH runs that binary (here a wrapper that leaves a mark), its other words as environment;
# a BIN= that is not an executable: a message and exit 2 before anything runs
printf '#!/bin/sh\n[ "$IB_AB_PROBE" = 3 ] && touch "%s/binwrap.ran"\nexec "%s" "$@"\n' "$T" "$BIN" > "$T/binwrap"
chmod +x "$T/binwrap"
bash bench/ab_bench.sh "$BIN" "$T/m" 1 "" "BIN=$T/binwrap IB_AB_PROBE=3" -- --batch 1 --prompt 4 --gen 2 --threads 1 --reps 1 \
    > "$T/ab.txt" 2> "$T/ab.err"
[ $? = 0 ] && [ -e "$T/binwrap.ran" ] \
    && [ "$(grep -cE "^BIN=$T/binwrap IB_AB_PROBE=3 +(B=1|prefill) +[0-9.]+  \(median [0-9.]+\)$" "$T/ab.txt")" = 2 ] \
    && ok || bad "ab_bench.sh BIN=: $(cat "$T/ab.txt" "$T/ab.err")"
bash bench/ab_bench.sh "$BIN" "$T/m" 1 "" "BIN=$T/nope-bin" -- --batch 1 > /dev/null 2> "$T/ab.err"; rc=$?
[ $rc = 2 ] && grep -q "$T/nope-bin is not an executable" "$T/ab.err" && ok || bad "ab_bench.sh BIN= not executable: exit $rc, $(cat "$T/ab.err")"

# bench/cuda_breakdown.sh: ab_bench.sh over the IB_CUDA_REPEAT settings, then per batch size the step's
# milliseconds (batch * 1000 / the plain setting's median tok/s) and each kind's growth of it (here on
# the CPU, where the settings change nothing: only the arithmetic and the table are checked); no `--`,
# or a failing bench: a message and a non-zero exit
bash bench/cuda_breakdown.sh "$BIN" "$T/m" 1 -- --batch 1,2 --prompt 4 --gen 2 --threads 1 --reps 1 \
    > "$T/bd.txt" 2> "$T/bd.err"
rc=$?
med2=$(awk '$1 == "(none)" && $2 == "B=2" { m = $NF; sub(/\)$/, "", m); print m }' "$T/bd.txt")
want2=$(awk -v m="$med2" 'BEGIN { if (m + 0 > 0) printf "%.3f", 2 * 1000.0 / m }')
got2=$(awk '$1 == "2" && NF == 7 { print $2 }' "$T/bd.txt")
[ $rc = 0 ] && grep -qE '^batch +step ms +\+attention +\+products +\+row norms +\+SwiGLU +\+empty kernels$' "$T/bd.txt" \
    && [ "$(grep -cE '^IB_CUDA_REPEAT=(attn|linear|norm|act|empty) +B=1 ' "$T/bd.txt")" = 5 ] \
    && [ -n "$want2" ] && [ "$got2" = "$want2" ] \
    && [ "$(awk '$1 == "1" && NF == 7 && $3 ~ /^[+-][0-9]+\.[0-9][0-9][0-9]$/' "$T/bd.txt" | wc -l)" = 1 ] \
    && ok || bad "cuda_breakdown.sh (step $got2, want $want2): $(cat "$T/bd.txt" "$T/bd.err")"
# a mixture-of-experts model also gets the experts' column (IB_CUDA_REPEAT=moe)
"$BIN" mkmodel --preset gemma4-moe-tiny --bits 4 --out "$T/moe" > /dev/null 2>&1 || bad "mkmodel gemma4-moe-tiny"
bash bench/cuda_breakdown.sh "$BIN" "$T/moe" 1 -- --batch 1 --prompt 4 --gen 2 --threads 1 --reps 1 > "$T/bd.txt" 2> "$T/bd.err" \
    && grep -qE '^batch +step ms +\+attention +\+products +\+row norms +\+SwiGLU +\+empty kernels +\+experts$' "$T/bd.txt" \
    && grep -qE '^IB_CUDA_REPEAT=moe +B=1 ' "$T/bd.txt" \
    && [ "$(awk '$1 == "1" && NF == 8 && $8 ~ /^[+-][0-9]+\.[0-9][0-9][0-9]$/' "$T/bd.txt" | wc -l)" = 1 ] \
    && ok || bad "cuda_breakdown.sh on a MoE model: $(cat "$T/bd.txt" "$T/bd.err")"
bash bench/cuda_breakdown.sh "$BIN" "$T/m" 1 --batch 1 > /dev/null 2> "$T/bd.err"; rc=$?
[ $rc = 2 ] && grep -q "usage: cuda_breakdown.sh" "$T/bd.err" && ok || bad "cuda_breakdown.sh without --: exit $rc, $(cat "$T/bd.err")"
bash bench/cuda_breakdown.sh "$BIN" "$T/nope" 1 -- --batch 1 > /dev/null 2> "$T/bd.err"; rc=$?
[ $rc = 1 ] && grep -q "bench failed under ''" "$T/bd.err" && ok || bad "cuda_breakdown.sh failing bench: exit $rc, $(cat "$T/bd.err")"

# bench --profile: a line after the prefill line and after each batch line, every category the tiny
# Qwen3 model's step calls (no moe), the total against the measured step; --json: the same as objects
# (every category, the calls per step the 2 layers imply, the categories within the measured step)
"$BIN" bench -m "$T/m" --batch 1,2 --prompt 8 --gen 4 --threads 2 --reps 2 --profile > "$T/prof.txt" 2>&1 \
    && grep -A1 "^prefill 8 tokens" "$T/prof.txt" | grep -q "^  profile prefill (ms/step):" \
    && grep -A1 -E "^ +2 " "$T/prof.txt" | grep -q "^  profile B=2 (ms/step):" \
    && [ "$(grep -c "^  profile " "$T/prof.txt")" = 3 ] && ok || bad "bench --profile lines: $(cat "$T/prof.txt")"
for c in embed rmsnorm qkv o gate/up down qk_prepare attention act add logits step; do
    [ "$(grep "^  profile " "$T/prof.txt" | grep -cE "  $c [0-9]+\.[0-9]{2} \([0-9]+%\)")" = 3 ] && ok \
        || bad "bench --profile: category $c missing from a line"
done
grep "^  profile " "$T/prof.txt" | grep -qE "  (moe|other) " && bad "bench --profile: a category the model never calls" || ok
[ "$(grep "^  profile " "$T/prof.txt" | grep -cE "  total [0-9]+\.[0-9]{2} of [0-9]+\.[0-9]{2} measured$")" = 3 ] && ok \
    || bad "bench --profile: total"
if "$BIN" bench -m "$T/m" --batch 1,3 --prompt 8 --gen 4 --threads 2 --reps 2 --profile --json > "$T/prof.json" 2>"$T/prof.err"; then
    node -e '
const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
const bad = [], names = ["embed", "rmsnorm", "qkv", "o", "gate/up", "down", "qk_prepare", "attention", "act", "moe",
                         "add", "logits", "step", "other"];
const per = {embed: 1, rmsnorm: 4, qkv: 2, o: 2, "gate/up": 2, down: 2, qk_prepare: 2, attention: 2, act: 2, moe: 0,
             add: 4, logits: 1, step: 2, other: 0};
const check = (p, steps, what) => {
  if (!p || p.steps !== steps) { bad.push(what + " steps"); return; }
  let sum = 0;
  for (const n of names) {
    const o = p.ops[n];
    if (!o || !(o.ms_per_step >= 0) || o.calls_per_step !== per[n]) { bad.push(what + " " + n); continue; }
    sum += o.ms_per_step;
    if (Math.abs(o.share - o.ms_per_step / p.measured_ms_per_step) > 1e-9) bad.push(what + " share " + n);
  }
  if (Object.keys(p.ops).length !== names.length) bad.push(what + " ops");
  if (Math.abs(sum - p.total_ms_per_step) > 1e-9 * sum || !(p.total_ms_per_step <= p.measured_ms_per_step)) bad.push(what + " total");
};
check(r.prefill_profile, 2, "prefill");
for (const d of r.decode) check(d.profile, 2 * 4, "B=" + d.batch);
if (bad.length) { console.log(bad.join(" ")); process.exit(1); }' "$T/prof.json" && ok || bad "bench --profile --json: $(cat "$T/prof.json")"
else
    bad "bench --profile --json failed: $(cat "$T/prof.err")"
fi

# other architectures and weight formats: Llama (no q/k norm), untied lm_head, 8-bit, bf16, f32
"$BIN" mkmodel --preset tiny --arch llama --seed 4 --out "$T/llama" >/dev/null || bad "mkmodel llama"
"$BIN" info -m "$T/llama" | grep -q "architecture llama" && ok || bad "info llama"
for spec in "llama:" "u8:--untied --bits 8 --group 128" "bf16:--bits 16" "f32:--bits 32 --untied"; do
    name=${spec%%:*}; flags=${spec#*:}
    # shellcheck disable=SC2086
    [ -d "$T/$name" ] || "$BIN" mkmodel --preset tiny --seed 6 $flags --out "$T/$name" >/dev/null || bad "mkmodel $name"
    "$BIN" generate -m "$T/$name" "${P[@]}" -n 6 --batch 6 --threads 2 --prefill-chunk 3 --check-serial >/dev/null 2>&1 \
        && ok || bad "$name: batched differs from serialized"
done

# accuracy: the engine against the float64 reference; f32 agrees on every token's argmax
"$BIN" accuracy -m "$T/m" --tokens 32 --threads 2 --json > "$T/acc" 2>/dev/null && ok || bad "accuracy --json"
for k in '"tokens":32' '"reference_seconds":' '"act":"f32"' '"act":"q8"' '"top1_agree":' '"kl_mean":' '"kl_max":' \
         '"max_abs_diff":' '"rel_l2":'; do
    grep -qF -- "$k" "$T/acc" && ok || bad "accuracy --json lacks $k"
done
grep -qF '"act":"f32","tokens":32,"top1_agree":32,"top1_fraction":1.0,' "$T/acc" && ok || bad "accuracy: f32 top-1 agreement is not 1: $(cat "$T/acc")"
"$BIN" accuracy -m "$T/m" --tokens 8 --act f32 -p "The quick brown fox jumps" > "$T/acct" 2>&1 \
    && grep -q "^f32 .* 8/8 = 1.000" "$T/acct" && ! grep -q "^q8 " "$T/acct" && ok || bad "accuracy table: $(cat "$T/acct")"
# --floor: the float32-storage reference's row, close to the float64 one but not equal to it
"$BIN" accuracy -m "$T/m" --tokens 8 --act f32 --floor --json > "$T/accf" 2>/dev/null && ok || bad "accuracy --floor"
python3 - "$T/accf" <<'PY' && ok || bad "accuracy --floor: $(cat "$T/accf")"
import json, sys
f = json.load(open(sys.argv[1]))["floor"]
assert f["act"] == "floor" and f["tokens"] == 8 and f["top1_agree"] == 8, f
assert 0 < f["rel_l2"] < 1e-5, f
PY
# --floor-parts: one row per stored part, each no larger than about the whole floor's share and the
# parts together accounting for it (their squares sum to about the floor's square); the table names them
"$BIN" accuracy -m "$T/m" --tokens 8 --act f32 --floor --floor-parts --json > "$T/accp" 2>/dev/null && ok || bad "accuracy --floor-parts"
python3 - "$T/accp" <<'PY' && ok || bad "accuracy --floor-parts: $(cat "$T/accp")"
import json, sys
d = json.load(open(sys.argv[1]))
f, parts = d["floor"], d["floor_parts"]
assert sorted(parts) == sorted(["residual", "normed", "qkv", "attention", "block", "hidden", "products", "logits"]), parts
for n, p in parts.items():
    assert p["act"] == n and p["tokens"] == 8 and p["top1_agree"] == 8, p
    assert 0 <= p["rel_l2"] < 2 * f["rel_l2"], (n, p, f)
s = sum(p["rel_l2"] ** 2 for p in parts.values()) ** 0.5
assert 0.3 * f["rel_l2"] < s < 3 * f["rel_l2"], (s, f)
PY
"$BIN" accuracy -m "$T/m" --tokens 4 --act f32 --floor-parts > "$T/accpt" 2>&1 && [ "$(grep -c '^part .*(only .* stored as float32)' "$T/accpt")" = 8 ] \
    && ok || bad "accuracy --floor-parts table: $(cat "$T/accpt")"

# expect_error NAME SUBSTRING CMD...: non-zero exit, the substring in stderr, one line, no sanitizer report
expect_error() {
    local name=$1 want=$2; shift 2
    local err rc
    err=$("$@" 2>&1 >/dev/null); rc=$?
    if [ $rc = 0 ]; then bad "$name: exit 0"; return; fi
    if [ $rc -ge 128 ]; then bad "$name: crashed (exit $rc)"; return; fi
    if printf '%s' "$err" | grep -qE "AddressSanitizer|runtime error|LeakSanitizer"; then bad "$name: sanitizer: $err"; return; fi
    if ! printf '%s' "$err" | grep -qF -- "$want"; then bad "$name: message '$err' lacks '$want'"; return; fi
    if [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then bad "$name: not one line: $err"; return; fi
    ok
}
B=$ASAN_BIN
expect_error "unknown command" "unknown command 'frobnicate'" "$B" frobnicate
expect_error "unknown flag" "unknown option '--bogus'" "$B" generate -m "$T/m" -p hi --bogus
expect_error "missing value" "-n: missing value" "$B" generate -m "$T/m" -p hi -n
expect_error "bad number" "--batch: bad value 'x'" "$B" generate -m "$T/m" -p hi --batch x
expect_error "bad isa" "--isa: unknown 'sse9'" "$B" generate -m "$T/m" -p hi --isa sse9
expect_error "bad kv dtype" "--kv-dtype: unknown 'q4' (f32, f16, q8)" "$B" generate -m "$T/m" -p hi --kv-dtype q4
# an ISA of the other architecture is a known name that this build never supports
case "$(uname -m)" in
    x86_64) expect_error "neon on x86" "isa neon: not supported" "$B" generate -m "$T/m" -p hi --isa neon ;;
    aarch64) expect_error "avx2 on aarch64" "isa avx2: not supported" "$B" generate -m "$T/m" -p hi --isa avx2
             expect_error "amx on aarch64" "isa amx: not supported by this CPU or build" "$B" generate -m "$T/m" -p hi --isa amx ;;
esac
# amx where the CPU (or the OS) has no AMX-INT8: the same one-line refusal, never another ISA in its place
if ! "$BIN" --version | grep -q "^kernels:.* amx"; then
    expect_error "amx not on this CPU" "isa amx: not supported by this CPU or build" "$B" generate -m "$T/m" -p hi --isa amx
fi
expect_error "no prompt" "no prompt" "$B" generate -m "$T/m"
expect_error "missing dir" "$T/none" "$B" generate -m "$T/none" -p hi
expect_error "bad prompt id" "--prompt-ids: bad id" "$B" generate -m "$T/m" --prompt-ids 1,2,99999
expect_error "context" "exceed the context" "$B" generate -m "$T/m" -p hello -n 5000
expect_error "accuracy bad act" "--act: unknown 'q4'" "$B" accuracy -m "$T/m" --act q4
expect_error "accuracy bad storage" "--ref-store: unknown 'f16'" "$B" accuracy -m "$T/m" --ref-store f16
expect_error "accuracy floor of f32" "--floor: needs the float64 reference" "$B" accuracy -m "$T/m" --floor --ref-store f32
expect_error "accuracy floor parts without reference" "--floor-parts: needs the float64 reference" "$B" accuracy -m "$T/m" --floor-parts --no-reference --logits-out "$T/fp.bin" --act f32
expect_error "accuracy one token" "at least 2 are needed" "$B" accuracy -m "$T/m" --prompt-ids 5
expect_error "accuracy bad id" "--prompt-ids: bad id" "$B" accuracy -m "$T/m" --prompt-ids 1,2,99999
expect_error "accuracy -p and ids" "not both" "$B" accuracy -m "$T/m" -p hi --prompt-ids 1,2
expect_error "accuracy q8 on floats" "not quantized" "$B" accuracy -m "$T/f32" --act q8 --tokens 4
expect_error "mkmodel preset" "--preset: unknown 'huge'" "$B" mkmodel --preset huge --out "$T/x"
expect_error "bench batch list" "--batch: bad list '1,0'" "$B" bench -m "$T/m" --batch 1,0
expect_error "bench reps" "--reps" "$B" bench -m "$T/m" --reps 99
expect_error "bench context" "exceeds the model's context" "$B" bench -m "$T/m" --prompt 8000 --gen 4000
expect_error "bench missing dir" "$T/none" "$B" bench -m "$T/none"
expect_error "bench kv policy" "--kv: 'window:0'" "$B" bench -m "$T/m" --kv window:0
expect_error "generate kv policy" "--kv: 'sink:2'" "$B" generate -m "$T/m" -p x --kv sink:2
# --profile with a backend that runs a step as one graph: refused before any work, on any machine
# (before the CUDA backend's own availability check), with nothing on stdout
expect_error "bench profile cuda" "--profile: backend cuda records a step and runs it as one graph" \
    "$B" bench -m "$T/m" --backend cuda --profile --batch 1 --prompt 4 --gen 2
"$B" bench -m "$T/m" --profile --backend cuda > "$T/profcuda.out" 2>/dev/null; prc=$?
[ "$prc" = 2 ] && [ ! -s "$T/profcuda.out" ] && ok || bad "bench --profile --backend cuda: exit $prc, stdout: $(cat "$T/profcuda.out")"
# the bandwidth probe process dying mid-run: a one-line error and a failing exit, not a floor of 0
"$B" bench -m "$T/m" --batch 1,2,4 --prompt 8 --gen 2000 --reps 15 > "$T/probe.out" 2> "$T/probe.err" &
bp=$!
child=""
child_of() { for d in /proc/[0-9]*; do [ "$(cut -d' ' -f4 "$d/stat" 2>/dev/null)" = "$1" ] && echo "${d#/proc/}"; done; }
for _ in $(seq 100); do child=$(child_of "$bp" | head -1); [ -n "$child" ] && break; sleep 0.05; done
sleep 0.5
[ -n "$child" ] && kill -9 "$child" 2>/dev/null
wait "$bp"; brc=$?
[ "$brc" != 0 ] && grep -q "the bandwidth probe process failed" "$T/probe.err" && [ "$(wc -l < "$T/probe.err")" = 1 ] && ok \
    || bad "bench with its probe killed: exit $brc, stderr: $(cat "$T/probe.err")"

# corrupted model directories (each a copy of the good one with one defect)
mk() { rm -rf "$T/$1"; cp -r "$T/m" "$T/$1"; }
ST=model.safetensors
mk notjson; printf '{"model_type": "qwen3",' > "$T/notjson/config.json"
expect_error "config not JSON" "notjson/config.json" "$B" info -m "$T/notjson"
mk contra; sed -i 's/"hidden_size": 128/"hidden_size": 256/' "$T/contra/config.json"
expect_error "config contradicts weights" "shape" "$B" info -m "$T/contra"
mk arch; sed -i 's/"model_type": "qwen3"/"model_type": "gpt2"/' "$T/arch/config.json"
expect_error "unknown architecture" "gpt2" "$B" info -m "$T/arch"
mk trunc; head -c 4 "$T/m/$ST" > "$T/trunc/$ST"
expect_error "truncated file" "trunc/$ST" "$B" info -m "$T/trunc"
mk cut; head -c $(( $(stat -c %s "$T/m/$ST") - 1000 )) "$T/m/$ST" > "$T/cut/$ST"
expect_error "truncated data" "cut/$ST" "$B" info -m "$T/cut"
mk hlen; printf '\xff\xff\xff\x0f\x00\x00\x00\x00' | dd of="$T/hlen/$ST" bs=1 conv=notrunc status=none
expect_error "header length past EOF" "header length" "$B" info -m "$T/hlen"
mk hjson; printf '\x7b\x7b' | dd of="$T/hjson/$ST" bs=1 seek=8 conv=notrunc status=none
expect_error "header not JSON" "hjson/$ST" "$B" info -m "$T/hjson"
mk missing; sed -i 's/"model.norm.weight"/"model.norX.weight"/' "$T/missing/$ST"
expect_error "missing tensor" "model.norm.weight" "$B" info -m "$T/missing"
mk dtype; sed -i '0,/"dtype":"U32"/s//"dtype":"I32"/' "$T/dtype/$ST"
expect_error "wrong dtype" "I32" "$B" info -m "$T/dtype"
# byte ranges and shapes, edited in place (same length, so the header stays valid JSON)
mk overlap; sed -i 's/"data_offsets":\[1280,2560\]/"data_offsets":[1000,2280]/' "$T/overlap/$ST"
expect_error "overlapping offsets" "tensors model.embed_tokens.biases and model.embed_tokens.scales overlap" "$B" info -m "$T/overlap"
mk range; sed -i 's/"data_offsets":\[245504,245760\]/"data_offsets":[945504,945760]/' "$T/range/$ST"
expect_error "offsets past the data" "tensor model.norm.weight: data_offsets [945504, 945760] past data end" "$B" info -m "$T/range"
mk shape; sed -i 's/"shape":\[320,2\]/"shape":[640,1]/' "$T/shape/$ST"
expect_error "wrong shape" "tensor model.embed_tokens.biases: shape [640,1], expected [320,2]" "$B" info -m "$T/shape"
cmp -s "$T/m/$ST" "$T/overlap/$ST" || cmp -s "$T/m/$ST" "$T/range/$ST" || cmp -s "$T/m/$ST" "$T/shape/$ST" \
    && bad "a safetensors edit did not apply (the tiny model's layout changed?)" || ok
# a prompt that alone is longer than the context (2048 tokens; the byte tokenizer: one per byte)
head -c 2100 /dev/zero | tr '\0' 'a' > "$T/long.txt"; echo >> "$T/long.txt"
expect_error "prompt longer than the context" "prompt 0: 2100 tokens + 1 new exceed the context of 2048" \
    "$B" generate -m "$T/m" --prompts-file "$T/long.txt" -n 1
# flags people type: a "did you mean", --flag=value, a missing tokenizer.json named (token ids still work)
expect_error "did you mean" "unknown option '--tmp' (did you mean --temp? try --help)" "$B" generate -m "$T/m" -p hi --tmp 0.5
expect_error "did you mean (serve)" "(did you mean --max-batch?" "$B" serve -m "$T/m" --max-bach 4
"$BIN" generate -m "$T/m" -p "Hello" -n 6 --ignore-eos --json > "$T/eq1" 2>/dev/null
"$BIN" generate -m "$T/m" -p "Hello" -n 6 --ignore-eos --json --batch=2 --threads=1 > "$T/eq2" 2>/dev/null \
    && [ -s "$T/eq1" ] && cmp -s "$T/eq1" "$T/eq2" && ok || bad "--flag=value: $(head -c 200 "$T/eq2")"
expect_error "--flag=value checked" "--batch: bad value 'x'" "$B" generate -m "$T/m" -p hi --batch=x
mk notok; rm "$T/notok/tokenizer.json"
expect_error "no tokenizer.json" "notok/tokenizer.json: missing" "$B" generate -m "$T/notok" -p hi -n 2
"$BIN" generate -m "$T/notok" --prompt-ids 1,2,3 -n 2 --json > /dev/null 2>&1 && ok || bad "--prompt-ids without tokenizer.json"
mk nocfg; rm "$T/nocfg/config.json"
expect_error "missing config" "nocfg/config.json" "$B" info -m "$T/nocfg"

# ---- generate as a pipeline tool: text on stdout, statistics on stderr, streaming, fresh seeds
# one prompt: stdout is the generated text alone (invalid UTF-8 as U+FFFD, as WHATWG TextDecoder does),
# the digest and the statistics on stderr, prompt and generation tok/s reported apart
"$BIN" generate -m "$T/m" -p "Hello" -n 12 --ignore-eos -t 2 > "$T/g1.out" 2> "$T/g1.err" && ok || bad "generate one prompt: exit $?"
"$BIN" generate -m "$T/m" -p "Hello" -n 12 --ignore-eos -t 2 --json > "$T/g1.json" 2>/dev/null
IDS=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).tokens.join(" "))' "$T/g1.json")
# shellcheck disable=SC2086
"$BIN" detokenize -m "$T/m" $IDS > "$T/g1.raw"
node -e 'const fs=require("fs");const want=new TextDecoder().decode(fs.readFileSync(process.argv[1]))+"\n";
         process.exit(fs.readFileSync(process.argv[2],"utf8")===want?0:1)' "$T/g1.raw" "$T/g1.out" \
    && ok || bad "generate: stdout is not exactly the generated text: $(head -c 100 "$T/g1.out" | od -c | head -3)"
grep -q "tok/s" "$T/g1.out" && bad "generate: statistics on stdout" || ok
grep -qE '^\[0\] digest [0-9a-f]{16}, 12 tokens, length$' "$T/g1.err" && ok || bad "generate: digest line on stderr: $(cat "$T/g1.err")"
grep -qE '^prompt: 5 tokens, [0-9.]+ tok/s \(.*\); generation: 11 tokens, [0-9.]+ tok/s \(' "$T/g1.err" \
    && ok || bad "generate: prompt and generation tok/s: $(cat "$T/g1.err")"
# unseeded sampling draws a fresh seed, says it on stderr and in --json; that seed repeats the run
"$BIN" generate -m "$T/m" -p "Hello" -n 16 --ignore-eos --temp 1 --json > "$T/u1" 2> "$T/u1.err"
"$BIN" generate -m "$T/m" -p "Hello" -n 16 --ignore-eos --temp 1 --json > "$T/u2" 2>/dev/null
S1=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).seed)' "$T/u1")
S2=$(node -e 'console.log(JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")).seed)' "$T/u2")
[[ "$S1" =~ ^[0-9]+$ ]] && [ "$S1" != "$S2" ] && ! cmp -s "$T/u1" "$T/u2" && ok || bad "unseeded sampling: seeds '$S1' '$S2' (want fresh ones, different answers)"
grep -q "seed $S1 (--seed $S1 repeats this run)" "$T/u1.err" && ok || bad "unseeded sampling: seed not reported on stderr: $(cat "$T/u1.err")"
"$BIN" generate -m "$T/m" -p "Hello" -n 16 --ignore-eos --temp 1 --seed "$S1" --json > "$T/u3" 2>/dev/null
cmp -s "$T/u1" "$T/u3" && ok || bad "--seed $S1 did not repeat the unseeded run"
if [ -f models/default/model.safetensors ]; then
    # several prompts streamed in order print exactly what the batch prints at the end
    DP=(-p "And God said" -p "In the beginning" -p "The LORD is my shepherd")
    "$BIN" generate "${DP[@]}" -n 24 --batch 2 -t 2 > "$T/ns.out" 2>/dev/null
    "$BIN" generate "${DP[@]}" -n 24 --batch 2 -t 2 --stream > "$T/st.out" 2>/dev/null
    [ -s "$T/st.out" ] && cmp -s "$T/ns.out" "$T/st.out" && ok || bad "--stream with several prompts differs: $(diff "$T/ns.out" "$T/st.out" | head -5)"
    # streaming: the first text arrives long before the end (a whole-run print would come at the end)
    node -e '
      const {spawn}=require("child_process"); const t0=Date.now(); let first=-1;
      const p=spawn(process.argv[1],["generate","-p","And God said","-n","600","--ignore-eos","-t","1"],{stdio:["ignore","pipe","ignore"]});
      p.stdout.on("data",()=>{ if(first<0) first=Date.now()-t0; });
      p.on("close",(rc)=>{ const total=Date.now()-t0; console.log(first+" "+total); process.exit(rc===0&&first>=0&&first<0.5*total?0:1); });' "$BIN" > "$T/stream.t" \
        && ok || bad "generate does not stream: first output at/of total ms: $(cat "$T/stream.t")"
    # chat: Ctrl-C while a reply is written stops that reply, not the program; Ctrl-C at the prompt
    # asks before leaving; the conversation goes on; /quit leaves with status 0
    node -e '
      const {spawn}=require("child_process"); let out="", err="", stage=0;
      const p=spawn(process.argv[1],["chat","-n","1500","-t","1"],{stdio:["pipe","pipe","pipe"]});
      const fail=(m)=>{ console.log(m+" | stderr: "+err.slice(-300)); p.kill("SIGKILL"); process.exit(1); };
      const timer=setTimeout(()=>fail("timed out at stage "+stage),60000);
      p.stdout.on("data",(d)=>{ out+=d; if(stage===0){ stage=1; p.kill("SIGINT"); } });
      p.stderr.on("data",(d)=>{ err+=d;
        if(stage===1&&err.includes("[reply interrupted]")){ stage=2; setTimeout(()=>p.kill("SIGINT"),300); }
        if(stage===2&&err.includes("Ctrl-C again")){ stage=3; p.stdin.write("/help\n/quit\n"); } });
      p.on("close",(rc)=>{ clearTimeout(timer);
        if(stage!==3||rc!==0||!err.includes("/reset")) fail("stage "+stage+", exit "+rc);
        process.exit(0); });
      p.stdin.write("And it came to pass\n");' "$BIN" > "$T/chatint" 2>&1 \
        && ok || bad "chat Ctrl-C: $(cat "$T/chatint")"
else
    echo "NOTICE: models/default absent: the streaming checks on the trained model were skipped"
fi

echo "t_cli: $pass passed, $fail failed"
[ $fail = 0 ]

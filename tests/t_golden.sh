#!/usr/bin/env bash
# Golden digests: every prompt's digest (the hash of the logits rows that chose its tokens) of a fixed
# set of generate configurations, compared with the values recorded in tests/golden/digests.txt. The
# configurations: the bundled trained model (models/default) with q8 and f32 activations, f32, f16 and
# q8 KV, greedy and seeded sampling, full and sink + window KV; the Gemma 4 dense and MoE tiny presets (sliding-window layers, the
# prompts longer than the window); two tiny Qwen presets with 8-bit and 16-bit weights. Each one runs
# on --isa scalar and on every other ISA this CPU has (the others: a SKIP line), with --batch 1 and with
# --batch 8 --prefill-chunk 5 (2 threads; recorded with 1), and every run must give the ONE recorded
# value: the digests do not depend on ISA, batch, threads or chunking. Any change of a canonical number
# fails the test. A fault that changes the numerics (--inject isa-fma, row-order, attn-tile-range) must make the digests
# differ from the recorded ones: the comparison can fail. Two configurations keep a sink + window KV
# policy (--kv) shorter than prompt + generation, so their sessions evict keys and wrap their rings.
#
#   bash tests/t_golden.sh            check against the recorded file
#   bash tests/t_golden.sh --record   rewrite the file from --isa scalar --batch 1 --threads 1, then check;
#                                     only for a deliberate, documented change of the canonical order
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/isobatch
GOLDEN=${GOLDEN:-tests/golden/digests.txt}
PROMPTS=examples/prompts.txt
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
record=0
[ "${1:-}" = --record ] && record=1
T=$(mktemp -d /tmp/ib_golden_XXXXXX)
trap 'rm -rf "$T"' EXIT

# name | model | arguments (besides -m, --isa and the schedule). A model is `default` (models/default)
# or PRESET:SEED:BITS, made by `mkmodel --preset PRESET --seed SEED --bits BITS`.
COMMON="--prompts-file $PROMPTS -n 16 --ignore-eos"
SAMPLED="--temp 0.8 --top-p 0.9 --seed 7"
CONFIGS=(
    "default-q8-kv32-greedy|default|$COMMON --act q8 --kv-dtype f32"
    "default-q8-kv16-greedy|default|$COMMON --act q8 --kv-dtype f16"
    "default-f32-kv32-greedy|default|$COMMON --act f32 --kv-dtype f32"
    "default-f32-kv16-greedy|default|$COMMON --act f32 --kv-dtype f16"
    "default-q8-kv32-seeded|default|$COMMON --act q8 --kv-dtype f32 $SAMPLED"
    "default-f32-kv16-seeded|default|$COMMON --act f32 --kv-dtype f16 $SAMPLED"
    "gemma4-tiny-b4-greedy|gemma4-tiny:4:4|$COMMON"
    "gemma4-tiny-b32-seeded|gemma4-tiny:4:32|$COMMON --kv-dtype f16 $SAMPLED"
    "gemma4-moe-tiny-b4-greedy|gemma4-moe-tiny:5:4|$COMMON"
    "gemma4-moe-tiny-b4-seeded|gemma4-moe-tiny:5:4|$COMMON --act f32 $SAMPLED"
    "qwen-tiny-b8-greedy|tiny:3:8|$COMMON"
    "qwen-tiny-b16-seeded|tiny:3:16|$COMMON $SAMPLED"
    "default-q8-kv16-sink4-window12-greedy|default|$COMMON --act q8 --kv-dtype f16 --kv sink:4,window:12"
    "default-f32-kv32-window10-seeded|default|$COMMON --act f32 --kv-dtype f32 --kv window:10 $SAMPLED"
    "default-q8-kvq8-greedy|default|$COMMON --act q8 --kv-dtype q8"
    "default-f32-kvq8-seeded|default|$COMMON --act f32 --kv-dtype q8 $SAMPLED"
    "default-q8-kvq8-sink4-window12-greedy|default|$COMMON --act q8 --kv-dtype q8 --kv sink:4,window:12"
    "gemma4-moe-tiny-b4-kvq8-greedy|gemma4-moe-tiny:5:4|$COMMON --kv-dtype q8"
)
SCHEDULES=("--batch 1 --threads 2" "--batch 8 --prefill-chunk 5 --threads 2")   # recorded: --threads 1

[ -x "$BIN" ] || { bad "$BIN missing (run make)"; echo "t_golden: $pass passed, $fail failed"; exit 1; }
[ -f models/default/model.safetensors ] || bad "models/default missing: its configurations cannot run"

# model_dir SPEC: the directory of a model spec, made on first use
model_dir() {
    [ "$1" = default ] && { echo models/default; return; }
    local d="$T/${1//:/_}"
    if [ ! -d "$d" ]; then
        IFS=: read -r preset seed bits <<< "$1"
        "$BIN" mkmodel --preset "$preset" --seed "$seed" --bits "$bits" --out "$d" >/dev/null 2>"$T/mk.err" \
            || { echo "mkmodel $1 failed: $(cat "$T/mk.err")" >&2; return 1; }
    fi
    echo "$d"
}

# digests DIR ARGS...: the digests of one generate --json run, space-separated, in prompt order
digests() {
    local d=$1; shift
    "$BIN" generate -m "$d" --json "$@" 2>"$T/gen.err" | grep -o '"digest":"[0-9a-f]*"' | cut -d'"' -f4 | paste -sd' '
}

# the ISAs: scalar, and the others this CPU has
ISAS=(scalar)
for isa in avx2 avx512 amx neon; do
    if "$BIN" generate -m models/default -p x -n 1 --isa $isa >/dev/null 2>"$T/isa.err"; then ISAS+=("$isa")
    elif grep -q "not supported" "$T/isa.err"; then echo "SKIP: --isa $isa (not supported on this CPU)"
    else bad "--isa $isa: $(cat "$T/isa.err")"; fi
done

nprompts=$(grep -c . "$PROMPTS")
if [ $record = 1 ]; then
    {
        echo "# Golden digests of tests/t_golden.sh: name | model | generate arguments | one digest per prompt"
        echo "# of $PROMPTS, in order. A model is 'default' (models/default) or PRESET:SEED:BITS (isobatch"
        echo "# mkmodel). Every ISA, --batch 1 and --batch 8 --prefill-chunk 5 must give these values."
        echo "# Recorded by 'bash tests/t_golden.sh --record' (--isa scalar --batch 1 --threads 1). Re-record only"
        echo "# for a deliberate change of the canonical order, and say so in the commit and in the docs; a"
        echo "# change that was meant to keep the numerics must leave this file as it is."
        for c in "${CONFIGS[@]}"; do
            IFS='|' read -r name spec args <<< "$c"
            d=$(model_dir "$spec") || exit 1
            # shellcheck disable=SC2086
            v=$(digests "$d" $args --isa scalar --batch 1 --threads 1)
            [ "$(wc -w <<< "$v")" = "$nprompts" ] || { echo "record: $name gave '$v': $(cat "$T/gen.err")" >&2; exit 1; }
            echo "$name | $spec | $args | $v"
        done
    } > "$T/new" || exit 1
    mkdir -p "$(dirname "$GOLDEN")" && cp "$T/new" "$GOLDEN" && echo "recorded $GOLDEN"
fi
[ -f "$GOLDEN" ] || { bad "$GOLDEN missing"; echo "t_golden: $pass passed, $fail failed"; exit 1; }

# field NAME K: field K of the recorded line NAME (2 model, 3 arguments, 4 digests)
field() { grep -v '^#' "$GOLDEN" | awk -F' [|] ' -v n="$1" -v f="$2" '$1 == n { print $f }'; }
[ "$(grep -vc '^#' "$GOLDEN")" = "${#CONFIGS[@]}" ] && ok \
    || bad "$GOLDEN has $(grep -vc '^#' "$GOLDEN") configurations, the script ${#CONFIGS[@]}"

for c in "${CONFIGS[@]}"; do
    IFS='|' read -r name spec args <<< "$c"
    want=$(field "$name" 4)
    if [ -z "$want" ] || [ "$(field "$name" 2)" != "$spec" ] || [ "$(field "$name" 3)" != "$args" ]; then
        bad "$name: not recorded with model '$spec' and arguments '$args' in $GOLDEN"; continue
    fi
    d=$(model_dir "$spec") || { bad "$name: model $spec"; continue; }
    for isa in "${ISAS[@]}"; do
        for sched in "${SCHEDULES[@]}"; do
            # shellcheck disable=SC2086
            got=$(digests "$d" $args --isa "$isa" $sched)
            [ "$got" = "$want" ] && ok \
                || bad "$name --isa $isa $sched: digests '$got' differ from the recorded '$want' $(head -1 "$T/gen.err")"
        done
    done
done

# the comparison can fail: faults that change the numerics give other digests than the recorded ones
fault_case() { # NAME FAULT ISA SCHEDULE
    local c name spec args want got
    for c in "${CONFIGS[@]}"; do [ "${c%%|*}" = "$1" ] && break; done
    IFS='|' read -r name spec args <<< "$c"
    want=$(field "$name" 4)
    d=$(model_dir "$spec") || { bad "$name: model $spec"; return; }
    # shellcheck disable=SC2086
    got=$(digests "$d" $args --isa "$3" $4 --inject "$2")
    [ "$(wc -w <<< "$got")" = "$nprompts" ] && [ "$got" != "$want" ] && ok \
        || bad "$name --isa $3 $4 --inject $2: digests '$got' not different from the recorded ones"
}
# (isa-fma fuses the vector kernels' multiply-adds: it changes nothing on scalar)
if [ ${#ISAS[@]} -gt 1 ]; then fault_case default-f32-kv32-greedy isa-fma "${ISAS[1]}" "--batch 1 --threads 2"
else echo "SKIP: --inject isa-fma (no vector ISA on this CPU)"; fi
fault_case qwen-tiny-b8-greedy row-order scalar "--batch 8 --prefill-chunk 5 --threads 2"
fault_case default-q8-kv16-sink4-window12-greedy split-kv-by-batch scalar "--batch 8 --prefill-chunk 5 --threads 2"
# (attn-tile-range: the rows of a prefill chunk attend its last row's keys; whole prompts, vector ISA)
fault_case default-q8-kv16-greedy attn-tile-range "${ISAS[${#ISAS[@]}-1]}" "--batch 1 --threads 2"

echo "t_golden: $pass passed, $fail failed"
[ $fail = 0 ]

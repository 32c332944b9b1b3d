#!/usr/bin/env bash
# compare_digests.sh OLD NEW [MODEL] — run the same generate matrix with two isobatch binaries and
# compare every prompt's digest (the hash of the logits rows that chose its tokens). Used to show that a
# change meant to keep the numerics kept every bit. Prints one line per configuration and exits 1 on
# any difference.
set -u
old=$1 new=$2 model=${3:-models/default}
prompts=examples/prompts.txt
fail=0 n=0
for isa in scalar avx2 avx512; do
    "$new" generate -m "$model" -p x -n 1 --isa "$isa" >/dev/null 2>&1 || { echo "skip isa $isa (not on this CPU)"; continue; }
    for act in q8 f32; do
        for kv in f32 f16; do
            for samp in "" "--temp 0.8 --top-p 0.9 --seed 7"; do
                for sched in "--batch 1" "--batch 8 --prefill-chunk 5" "--batch 4 --prefill-chunk whole --threads 2"; do
                    args="-m $model --prompts-file $prompts -n 24 --json --isa $isa --act $act --kv-dtype $kv $samp $sched"
                    a=$("$old" generate $args 2>/dev/null | grep -o '"digest": *"[0-9a-f]*"' | tr '\n' ' ')
                    b=$("$new" generate $args 2>/dev/null | grep -o '"digest": *"[0-9a-f]*"' | tr '\n' ' ')
                    n=$((n + 1))
                    if [ -z "$a" ] || [ "$a" != "$b" ]; then
                        echo "DIFF: $args"
                        fail=1
                    fi
                done
            done
        done
    done
done
echo "$n configurations compared, $( [ $fail = 0 ] && echo 'all digests equal' || echo 'DIGESTS DIFFER')"
exit $fail

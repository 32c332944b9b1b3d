#!/usr/bin/env bash
# Gemma 4 (dense) end to end on `mkmodel --preset gemma4-tiny` (docs/gemma4.md): the engine's logits
# against an independent float64 reference (tests/gemma4_ref.py, python3 + numpy) with prompts past
# the sliding window, also with sliding-window rings (chunked prefill, a ring one slot too small
# must fail); the invariance matrix through `generate --json` (batch, threads, prefill
# chunks, ISAs, order, greedy and seeded, f32 and f16 KV, float and 4-bit weights), each kind of
# comparison failing under --inject; --check-serial under the batch faults; KV sharing across layers
# (num_kv_shared_layers, `mkmodel --kv-shared 2`) against both float64 references and batch-invariant;
# per-layer embeddings (hidden_size_per_layer_input, `mkmodel --ple P`) with KV sharing, likewise;
# use_double_wide_mlp (the KV-shared layers' MLPs 2F wide, `mkmodel --kv-shared 2 --double-wide`),
# likewise, with its shapes and a wrong-shaped file's one-line error; probe's op table on KV-shared and
# per-layer-embedding models, clean and failing under faults it must catch;
# and config.json files with the Gemma 4 features not implemented yet: a one-line error naming the field.
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/isobatch
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_gemma4_XXXXXX)
trap 'rm -rf "$T"' EXIT
. tests/gemma4_lib.sh

"$BIN" mkmodel --preset gemma4-tiny --bits 32 --seed 4 --out "$T/m32" >/dev/null || bad "mkmodel gemma4-tiny --bits 32"
"$BIN" mkmodel --preset gemma4-tiny --bits 4 --seed 4 --out "$T/m4" >/dev/null || bad "mkmodel gemma4-tiny --bits 4"
"$BIN" info -m "$T/m32" | grep -q "architecture gemma4" && ok || bad "info: architecture gemma4"

# ---- the float64 reference (numpy): prompts of 3, 40 and 90 tokens (window 16), greedy and sampled
ref_python
if [ -z "$PY" ]; then
    bad "python3 with numpy missing (apt-get install python3-numpy): the float64 reference cannot run"
else
    for len in 3 40 90; do
        for s in "" "--temp 1.5 --seed 7"; do reference_case m32 "$len" "$s"; done
    done
fi

# ---- sliding-window rings (sliding_window + kv_chunk - 1 slots; generate's kv_chunk is its prefill
# chunk): 90 tokens and 24 more, past the window (16), in chunks smaller and larger than the window,
# against the float64 reference; rings one slot too small (--inject kv-ring-short) must fail it
if [ -n "$PY" ]; then
    for s in "--prefill-chunk 5" "--prefill-chunk 40"; do reference_case m32 90 "$s"; done
    ids=$(seq 7 96 | awk '{print ($1 * 37) % 300}' | paste -sd,)
    "$BIN" generate -m "$T/m32" --prompt-ids "$ids" -n 24 --ignore-eos --prefill-chunk 40 --inject kv-ring-short \
        --json --logits-out "$T/l.bin" > "$T/o.json" 2>/dev/null || bad "generate --inject kv-ring-short"
    gen=$(grep -o '"tokens":\[[0-9,]*\]' "$T/o.json" | grep -o '[0-9,]*' | sed 's/^,//')
    out=$("$PY" tests/gemma4_ref.py "$T/m32" "$ids,$gen" "$T/l.bin" 89 2>&1)
    echo "$out" | grep -q "FAIL" && ok || bad "kv-ring-short still matches the reference: $out"
fi
# the bytes a session takes: 100 positions in the full layers, 16 + 8 - 1 in the sliding ones (each
# layer at its own shape: 1024 bytes a position for the two sliding layers, 1024 for the two full ones)
"$BIN" info -m "$T/m32" --json --context 100 --kv-chunk 8 | grep -q '"kv_bytes_per_session":125952' \
    && ok || bad "info --kv-chunk 8: $("$BIN" info -m "$T/m32" --json --context 100 --kv-chunk 8)"
"$BIN" info -m "$T/m32" --json --context 100 --kv-chunk 0 | grep -q '"kv_bytes_per_session":204800' \
    && ok || bad "info --kv-chunk 0: $("$BIN" info -m "$T/m32" --json --context 100 --kv-chunk 0)"

# ---- invariance: every --json line equal to the serialized scalar run
make_prompts
for m in m32 m4; do
    for kv in f32 f16; do
        for mode in greedy seeded; do invariance "$m" "$kv" "$mode"; done
    done
done
gen "$T/m4" --act f32 --batch 1 > "$T/a" && gen "$T/m4" --act f32 --batch 7 --threads 2 | cmp -s "$T/a" - \
    && ok || bad "m4 --act f32: batch 7 differs from batch 1"

# ---- each comparison fails when both of its runs carry a fault of the kind it must catch
REF1="--batch 1 --threads 1 --isa scalar"
for f in rope-scalar-offset rope-skip-rows gemv-gemm split-kv-by-batch; do fault_breaks m4 $f "$REF1" "--batch 8"; done
fault_breaks m4 split-k-threads "$REF1" "--batch 1 --threads 3 --isa scalar"
fault_breaks m4 row-order "$REF1" "--batch 8" reversed
fault_breaks m4 gemv-gemm "$REF1" "--batch 1 --threads 1 --isa scalar --prefill-chunk 1"
fault_breaks m4 kv-ring-short "$REF1" "--batch 3 --prefill-chunk 7"
fault_breaks m4 shared-rng "$REF1 ${SAMPLING[*]}" "--batch 8 ${SAMPLING[*]}"
for isa in avx2 avx512; do
    gen "$T/m4" --isa $isa -n 1 > /dev/null 2>&1 || continue
    for act in q8 f32; do fault_breaks m4 isa-fma "$REF1 --act $act" "--batch 1 --threads 1 --isa $isa --act $act"; done
done
for m in m32 m4; do
    "$BIN" generate -m "$T/$m" --prompts-file "$PF" -n 8 --ignore-eos --batch 8 --check-serial > "$T/cs" 2>&1 \
        && ok || bad "$m: --check-serial: $(tail -2 "$T/cs")"
    for f in rope-scalar-offset rope-skip-rows gemv-gemm split-kv-by-batch row-order; do
        "$BIN" generate -m "$T/$m" --prompts-file "$PF" -n 8 --ignore-eos --batch 8 --check-serial --inject $f > "$T/cs" 2>&1
        rc=$?
        [ $rc = 1 ] && grep -q "differs from its serialized run" "$T/cs" && ok || bad "$m: --check-serial --inject $f: exit $rc"
    done
done

# ---- diff: clean, and the first divergent layer and sub-op under faults
"$BIN" diff -m "$T/m4" > "$T/d" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^no divergence" "$T/d" && ok || bad "diff clean: exit $rc"
for spec in "rope-skip-rows:step 1, layer 0, point q: sub-op rope" \
            "split-kv-by-batch:step 0, layer 0, point attn_out: sub-op attention"; do
    f=${spec%%:*}; want=${spec#*:}
    "$BIN" diff -m "$T/m4" --inject "$f" > "$T/d" 2>&1; rc=$?
    [ $rc = 1 ] && grep -q "^first divergence: $want" "$T/d" && ok || bad "diff --inject $f: exit $rc, $(grep '^first' "$T/d")"
done
"$BIN" diff -m "$T/m32" --json > "$T/dj" 2>&1 && grep -q '"post_attn_norm"' "$T/dj" && ok || bad "diff --json: no post_attn_norm point"

# ---- probe: the backend op table inside whole Gemma 4 steps (post-norms, GeGLU, layer scalar,
# soft-cap, per-type widths and RoPE, sliding rings) bitwise against the scalar references
"$BIN" probe -m "$T/m4" > "$T/p" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^backend op table: every op bitwise equal" "$T/p" && ok || bad "probe on gemma4: exit $rc, $(tail -2 "$T/p")"
"$BIN" probe -m "$T/m4" --backend scalar --inject gemv-gemm > "$T/p" 2>&1; rc=$?
[ $rc = 1 ] && grep -qE "linear q/k/v +[0-9]+ floats +DIFFER" "$T/p" && ok || bad "probe --inject gemv-gemm on gemma4: exit $rc"

# ---- a config.json field not implemented yet: one line naming it, exit 1
badcfg 'c["enable_moe_block"]=True' "field num_experts: missing"
badcfg 'c["hidden_size_per_layer_input"]=256' "field vocab_size_per_layer_input: a per-layer embedding vocabulary other"
badcfg 'c["hidden_size_per_layer_input"]=256; c["vocab_size_per_layer_input"]=320' "tensor model.embed_tokens_per_layer.weight: missing"
badcfg 'c["num_kv_shared_layers"]=4' "field num_kv_shared_layers: 4 leaves no layer with keys and values of its own"
badcfg 'c["num_kv_shared_layers"]=3' "layer 1 (full_attention) has no earlier non-shared layer of its type"
# use_double_wide_mlp on a file whose shared layers' MLPs are F wide: the first such tensor, by name
badcfg 'c["num_kv_shared_layers"]=2; c["use_double_wide_mlp"]=True' \
    "tensor model.layers.2.mlp.gate_proj.weight: shape [256,128], expected [512,128]"
badcfg 'c["use_bidirectional_attention"]="vision"' "field use_bidirectional_attention"
badcfg 'c["attn_logit_softcapping"]=50.0' "field attn_logit_softcapping"
badcfg 'c["query_pre_attn_scalar"]=256' "field query_pre_attn_scalar"
badcfg 'c["attention_bias"]=True' "field attention_bias"
badcfg 'c["hidden_activation"]="silu"' "field hidden_activation"
badcfg 'c["layer_types"][-1]="sliding_attention"' "the last layer must be full_attention"
badcfg 'c["layer_types"]=c["layer_types"][:3]' "field layer_types: expected a list of 4 strings"
badcfg 'c["rope_parameters"]["full_attention"]["rope_type"]="yarn"' "rope_parameters.full_attention.rope_type"
badcfg 'c["rope_parameters"]["sliding_attention"]["rope_type"]="proportional"' "rope_parameters.sliding_attention.rope_type"
badcfg 'c["rope_parameters"]["full_attention"]["factor"]=8.0' "rope_parameters.full_attention.factor"
badcfg 'c["per_layer_config"]={"0": {"head_dim": 64}}' "overrides on a sliding layer"
badcfg 'c["global_head_dim"]=48' "tensor model.layers.1.self_attn.q_norm.weight"
badcfg 'c["model_type"]="gemma4"' "field text_config: missing"
# the same model as model_type gemma4 with a text_config loads (the text model alone)
if [ -n "$PY" ]; then
    rm -rf "$T/wrap"; cp -r "$T/m32" "$T/wrap"
    "$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); w={'model_type':'gemma4','text_config':c}; json.dump(w, open(sys.argv[1],'w'))" \
        "$T/wrap/config.json"
    "$BIN" info -m "$T/wrap" > "$T/w.out" 2>&1; grep -q "tensor model.language_model.embed_tokens.weight" "$T/w.out" \
        && ok || bad "gemma4 wrapper: expected the language_model tensor names: $(cat "$T/w.out")"
fi
# accuracy_close M: isobatch against its float64 reference on $T/M over 60 tokens, f32 activations:
# relative L2 in (0, 1e-5) and every top-1 equal
accuracy_close() {
    "$BIN" accuracy -m "$T/$1" --tokens 60 --act f32 --json > "$T/acc" 2>&1
    grep -qF '"top1_agree":60,' "$T/acc" && awk -F'"rel_l2":' '{split($2, a, /[,}]/); exit !(a[1] + 0 > 0 && a[1] + 0 < 1e-5)}' "$T/acc" \
        && ok || bad "accuracy on $1: $(cat "$T/acc")"
}
# serial_and_diff M: --check-serial at batch 8 and `diff` (no divergence) on $T/M
serial_and_diff() {
    "$BIN" generate -m "$T/$1" --prompts-file "$PF" -n 8 --ignore-eos --batch 8 --check-serial > "$T/cs" 2>&1 \
        && ok || bad "$1: --check-serial: $(tail -2 "$T/cs")"
    "$BIN" diff -m "$T/$1" > "$T/d" 2>&1; local rc=$?
    [ $rc = 0 ] && grep -q "^no divergence" "$T/d" && ok || bad "diff on $1: exit $rc"
}
# ---- KV sharing (num_kv_shared_layers 2: layer 2 reads layer 0's keys and values, layer 3 layer 1's;
# neither has k_proj, v_proj or k_norm): the numpy and the C float64 references, past the window and
# with sliding rings; batch invariance; half the KV bytes; the check still fails one position off
"$BIN" mkmodel --preset gemma4-tiny --bits 32 --seed 4 --kv-shared 2 --out "$T/ks32" >/dev/null || bad "mkmodel --kv-shared 2"
"$BIN" mkmodel --preset gemma4-tiny --bits 4 --seed 4 --kv-shared 2 --out "$T/ks4" >/dev/null || bad "mkmodel --kv-shared 2 --bits 4"
if [ -n "$PY" ]; then
    for len in 3 40 90; do reference_case ks32 "$len" ""; done
    for s in "--prefill-chunk 5" "--temp 1.5 --seed 7 --prefill-chunk 40"; do reference_case ks32 90 "$s"; done
fi
"$BIN" info -m "$T/ks32" --json --context 100 --kv-chunk 8 | grep -q '"kv_bytes_per_session":62976' \
    && ok || bad "info on the KV-shared model: $("$BIN" info -m "$T/ks32" --json --context 100 --kv-chunk 8)"
for m in ks32 ks4; do accuracy_close "$m"; done
invariance ks4 f32 greedy
invariance ks4 f16 seeded
invariance ks32 f32 greedy
fault_breaks ks4 rope-skip-rows "$REF1" "--batch 8"
fault_breaks ks4 split-kv-by-batch "$REF1" "--batch 8"
serial_and_diff ks4
# a file that still holds the shared layers' k/v tensors (transformers ignores them): loads, same logits
if [ -n "$PY" ]; then
    rm -rf "$T/ksf"; cp -r "$T/m32" "$T/ksf"
    "$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); c['num_kv_shared_layers']=2; json.dump(c, open(sys.argv[1],'w'))" \
        "$T/ksf/config.json"
    "$BIN" info -m "$T/ksf" > "$T/ksf.out" 2>&1 && grep -q "architecture gemma4" "$T/ksf.out" \
        && ok || bad "KV-shared config on a file with every layer's k/v: $(cat "$T/ksf.out")"
fi
"$BIN" probe -m "$T/ks4" > "$T/p" 2>&1
[ $? = 0 ] && grep -q "^backend op table: every op bitwise equal" "$T/p" && grep -qE "cpu scalar +q8 +[0-9]+ ops" "$T/p" \
    && ok || bad "probe on the KV-shared model: $(tail -2 "$T/p")"

# ---- per-layer embeddings (hidden_size_per_layer_input) together with KV sharing: both float64
# references past the window and with rings, batch invariance (f32 and q8), diff; probe's op table
"$BIN" mkmodel --preset gemma4-tiny --bits 32 --seed 5 --ple 32 --kv-shared 2 --out "$T/pl32" >/dev/null || bad "mkmodel --ple 32"
"$BIN" mkmodel --preset gemma4-tiny --bits 4 --seed 5 --ple 64 --kv-shared 2 --out "$T/pl4" >/dev/null || bad "mkmodel --ple 64 --bits 4"
if [ -n "$PY" ]; then
    for len in 3 90; do reference_case pl32 "$len" ""; done
    for s in "--prefill-chunk 5" "--temp 1.5 --seed 7 --prefill-chunk 40"; do reference_case pl32 90 "$s"; done
fi
for m in pl32 pl4; do accuracy_close "$m"; done
invariance pl4 f32 greedy
invariance pl32 f32 seeded
gen "$T/pl4" --act f32 --batch 1 > "$T/a" && gen "$T/pl4" --act f32 --batch 7 --threads 2 | cmp -s "$T/a" - \
    && ok || bad "pl4 --act f32: batch 7 differs from batch 1"
fault_breaks pl4 rope-skip-rows "$REF1" "--batch 8"
serial_and_diff pl4
"$BIN" probe -m "$T/pl4" > "$T/p" 2>&1
[ $? = 0 ] && grep -q "^backend op table: every op bitwise equal" "$T/p" && grep -qE "cpu scalar +q8 +[0-9]+ ops" "$T/p" \
    && ok || bad "probe on the per-layer-embedding model: $(tail -2 "$T/p")"
# ple-row0 (every row's per-layer table row from the step's first token) is a batch fault
fault_breaks pl4 ple-row0 "$REF1" "--batch 8"

# ---- probe's op table on a KV-shared (1 layer) per-layer-embedding (P 8) model: every op, the shared
# layer's q-only product, q norm, RoPE and attention over its source's cache and the per-layer ops
# among them, bitwise against the scalar references; failing where a fault breaks one
"$BIN" mkmodel --preset gemma4-tiny --bits 32 --seed 6 --kv-shared 1 --ple 8 --out "$T/kp8" >/dev/null \
    || bad "mkmodel --kv-shared 1 --ple 8"
"$BIN" probe -m "$T/kp8" --backend cpu -v > "$T/p" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^backend op table: every op bitwise equal" "$T/p" && ok || bad "probe on kp8: exit $rc, $(tail -2 "$T/p")"
for op in "ple_inputs" "ple_layer" "linear q (kv-shared)" "q norm (kv-shared)" "rope q (kv-shared)" "attention (kv-shared)"; do
    grep -qE "^  cpu scalar +f32 +$(printf '%s' "$op" | sed 's/[()]/\\&/g') +[0-9]+ floats +bitwise equal" "$T/p" \
        && ok || bad "probe on kp8: op '$op' not checked"
done
# each fault at the op it breaks: ple-row0 at ple_inputs alone (ple_layer reads the inputs back, so
# the error does not carry over), rope-skip-rows at the shared layer's RoPE of its queries too
for spec in "ple-row0:ple_inputs" "rope-skip-rows:rope q \(kv-shared\)"; do
    f=${spec%%:*}; op=${spec#*:}
    "$BIN" probe -m "$T/kp8" --backend cpu --inject "$f" > "$T/p" 2>&1; rc=$?
    [ $rc = 1 ] && grep -qE "^  cpu scalar +f32 +$op +[0-9]+ floats +DIFFER" "$T/p" && grep -q "^backend op table: FAILED" "$T/p" \
        && ok || bad "probe --inject $f on kp8: exit $rc, $(grep DIFFER "$T/p" | head -3)"
done
"$BIN" probe -m "$T/kp8" --backend cpu --inject ple-row0 > "$T/p" 2>&1
grep -qE "ple_layer .*DIFFER" "$T/p" && bad "probe --inject ple-row0: the error carried over to ple_layer" || ok

# ---- use_double_wide_mlp (`mkmodel --kv-shared 2 --double-wide`): the shared layers 2 and 3 have MLPs
# of 2F (512): info shows them as loaded, both float64 references (the numpy one checks every MLP's shape
# against the config as transformers builds it), batch invariance, diff, probe; a config that does not
# say double-wide on such a file: a one-line error naming the tensor; --double-wide alone refused
"$BIN" mkmodel --preset gemma4-tiny --bits 32 --seed 8 --kv-shared 2 --double-wide --out "$T/dw32" >/dev/null \
    || bad "mkmodel --kv-shared 2 --double-wide"
"$BIN" mkmodel --preset gemma4-tiny --bits 4 --seed 8 --kv-shared 2 --double-wide --out "$T/dw4" >/dev/null \
    || bad "mkmodel --kv-shared 2 --double-wide --bits 4"
"$BIN" info -m "$T/dw32" --json > "$T/i" 2>&1
grep -q '"intermediate_size":256,' "$T/i" && grep -q '"double_wide_layers":2,' "$T/i" && grep -q '"double_wide_intermediate_size":512' "$T/i" \
    && ok || bad "info on the double-wide model: $(cat "$T/i")"
"$BIN" info -m "$T/ks32" --json | grep -q double_wide && bad "info on ks32 shows double-wide layers" || ok
# parameters: ks32's plus 2 layers x 3 x D x F more (128 x 256 x 3 x 2 = 196608)
pk=$("$BIN" info -m "$T/ks32" --json | grep -o '"params":[0-9]*' | cut -d: -f2)
pd=$(grep -o '"params":[0-9]*' "$T/i" | cut -d: -f2)
[ -n "$pk" ] && [ -n "$pd" ] && [ $((pd - pk)) = 196608 ] && ok || bad "double-wide params $pd vs KV-shared $pk"
if [ -n "$PY" ]; then
    for len in 3 90; do reference_case dw32 "$len" ""; done
    reference_case dw32 90 "--temp 1.5 --seed 7 --prefill-chunk 5"
fi
for m in dw32 dw4; do accuracy_close "$m"; done
invariance dw4 f32 greedy
invariance dw32 f16 seeded
gen "$T/dw4" --act f32 --batch 1 > "$T/a" && gen "$T/dw4" --act f32 --batch 7 --threads 2 | cmp -s "$T/a" - \
    && ok || bad "dw4 --act f32: batch 7 differs from batch 1"
fault_breaks dw4 gemv-gemm "$REF1" "--batch 8"
serial_and_diff dw4
"$BIN" probe -m "$T/dw4" -v > "$T/p" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^backend op table: every op bitwise equal" "$T/p" && ok || bad "probe on dw4: exit $rc, $(tail -2 "$T/p")"
# geglu checked at every layer's own width: 2 x F + 2 x 2F = 1.5 x the floats of the KV-shared model's
gk=$("$BIN" probe -m "$T/ks4" -v 2>&1 | grep -E "^  cpu scalar +q8 +geglu " | awk '{print $5}')
gd=$(grep -E "^  cpu scalar +q8 +geglu " "$T/p" | awk '{print $5}')
[ -n "$gk" ] && [ -n "$gd" ] && [ $((gk * 3)) = $((gd * 2)) ] && ok || bad "probe geglu floats: double-wide $gd, KV-shared $gk"
if [ -n "$PY" ]; then
    rm -rf "$T/dwbad"; cp -r "$T/dw32" "$T/dwbad"
    "$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); c['use_double_wide_mlp']=False; json.dump(c, open(sys.argv[1],'w'))" \
        "$T/dwbad/config.json"
    "$BIN" info -m "$T/dwbad" > "$T/dwbad.out" 2>&1; rc=$?
    [ $rc = 1 ] && [ "$(wc -l < "$T/dwbad.out")" = 1 ] \
        && grep -qF "tensor model.layers.2.mlp.gate_proj.weight: shape [512,128], expected [256,128]" "$T/dwbad.out" \
        && ok || bad "double-wide file without use_double_wide_mlp: exit $rc, $(cat "$T/dwbad.out")"
    # the numpy reference refuses the same mismatch (its MLP widths come from the config)
    "$PY" tests/gemma4_ref.py "$T/dwbad" "1,2,3" "$T/l.bin" 0 > "$T/r.out" 2>&1
    grep -q "layer 2 mlp.gate_proj: shape (512, 128), the config says (256, 128)" "$T/r.out" && ok \
        || bad "gemma4_ref.py on a wrong-shaped file: $(cat "$T/r.out")"
fi
# without KV sharing the field widens nothing (as in transformers): the plain model loads as it is
if [ -n "$PY" ]; then
    rm -rf "$T/dwn"; cp -r "$T/m32" "$T/dwn"
    "$PY" -c "import json,sys; c=json.load(open(sys.argv[1])); c['use_double_wide_mlp']=True; json.dump(c, open(sys.argv[1],'w'))" \
        "$T/dwn/config.json"
    "$BIN" info -m "$T/dwn" --json > "$T/dwn.out" 2>&1 && ! grep -q double_wide "$T/dwn.out" && ok \
        || bad "use_double_wide_mlp without KV sharing: $(cat "$T/dwn.out")"
fi
"$BIN" mkmodel --preset gemma4-tiny --double-wide --out "$T/x" > "$T/x.out" 2>&1; rc=$?
[ $rc = 1 ] && [ "$(wc -l < "$T/x.out")" = 1 ] && grep -q "double_wide: needs kv_shared" "$T/x.out" && ok \
    || bad "mkmodel --double-wide without --kv-shared: exit $rc, $(cat "$T/x.out")"

# ---- accuracy: the engine against the C float64 reference (src/diag/reference.c) over 60 tokens,
# past the window: f32 agrees on every argmax and within 1e-5 relative L2
"$BIN" accuracy -m "$T/m32" --tokens 60 --act f32 --json > "$T/acc" 2>&1
grep -qF '"top1_agree":60,' "$T/acc" && awk -F'"rel_l2":' '{split($2, a, /[,}]/); exit !(a[1] + 0 > 0 && a[1] + 0 < 1e-5)}' "$T/acc" \
    && ok || bad "accuracy on m32: $(cat "$T/acc")"
# --per-position: one relative L2 per position (the 12 of them), refused with --act both
"$BIN" accuracy -m "$T/m32" --tokens 12 --act f32 --per-position --json > "$T/acc" 2>&1
grep -qE '"rel_l2_per_position":\[([0-9.e+-]+,){11}[0-9.e+-]+\]' "$T/acc" && ok || bad "accuracy --per-position: $(cat "$T/acc")"
"$BIN" accuracy -m "$T/m32" --tokens 12 --per-position > "$T/acc" 2>&1
[ $? = 2 ] && grep -q "give one --act" "$T/acc" && ok || bad "accuracy --per-position with --act both: $(cat "$T/acc")"
echo "t_gemma4: $pass passed, $fail failed"
[ $fail = 0 ]

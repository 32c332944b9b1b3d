#!/usr/bin/env bash
# Gemma 4's MoE block end to end on `mkmodel --preset gemma4-moe-tiny` (8 experts, top-k 2;
# docs/gemma4.md "Mixture of experts"): the engine's logits against the independent float64 reference
# (tests/gemma4_ref.py), the invariance matrix (batch, threads, prefill chunks, ISAs, order, greedy and
# seeded, f32 and f16 KV, float and 4-bit weights; also 40 experts, top-k 5), the MoE faults caught (moe-capacity: routing that
# depends on the batch; moe-combine-by-load: expert outputs summed in the batch's order, which needs
# top-k >= 3 to change any bits: with two outputs 0 + a + b = 0 + b + a), and the MoE config errors.
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/isobatch
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_gemma4moe_XXXXXX)
trap 'rm -rf "$T"' EXIT
. tests/gemma4_lib.sh

"$BIN" mkmodel --preset gemma4-moe-tiny --bits 32 --seed 5 --out "$T/m32" >/dev/null || bad "mkmodel gemma4-moe-tiny --bits 32"
"$BIN" mkmodel --preset gemma4-moe-tiny --bits 4 --seed 5 --out "$T/m4" >/dev/null || bad "mkmodel gemma4-moe-tiny --bits 4"
"$BIN" mkmodel --preset gemma4-moe-tiny --bits 4 --seed 5 --top-k 3 --out "$T/k3" >/dev/null || bad "mkmodel --top-k 3"
"$BIN" mkmodel --preset gemma4-tiny --top-k 3 --out "$T/no" >/dev/null 2>&1 && bad "mkmodel --top-k on a dense preset" || ok
"$BIN" info -m "$T/m32" | grep -q "architecture gemma4" && ok || bad "info: architecture gemma4"
"$BIN" info -m "$T/k3" | grep -q "experts      8 per layer, 3 per token, expert ffn 64" && ok || bad "info: the experts line"
# many experts (mkmodel --experts): 40 a layer, top-k 5 — the routing's top-k and softmax over more ids
"$BIN" mkmodel --preset gemma4-moe-tiny --bits 32 --seed 5 --experts 40 --top-k 5 --out "$T/e40" >/dev/null || bad "mkmodel --experts 40"
"$BIN" info -m "$T/e40" | grep -q "experts      40 per layer, 5 per token, expert ffn 64" && ok || bad "info: the experts line of e40"

# ---- the float64 reference (numpy): prompts of 3 and 40 tokens (window 16), greedy and sampled
ref_python
if [ -z "$PY" ]; then
    bad "python3 with numpy missing (apt-get install python3-numpy): the float64 reference cannot run"
else
    "$BIN" mkmodel --preset gemma4-moe-tiny --bits 32 --seed 5 --top-k 3 --out "$T/k3f" >/dev/null
    for m in m32 k3f e40; do
        for len in 3 40; do
            for s in "" "--temp 1.5 --seed 7"; do reference_case "$m" "$len" "$s"; done
        done
    done
fi

# ---- invariance: every --json line equal to the serialized scalar run
make_prompts
for m in m32 m4 k3 e40; do
    for kv in f32 f16; do
        for mode in greedy seeded; do
            [ $m != m4 ] && [ $kv = f16 ] && continue
            invariance "$m" "$kv" "$mode"
        done
    done
done
gen "$T/m4" --act f32 --batch 1 > "$T/a" && gen "$T/m4" --act f32 --batch 7 --threads 2 | cmp -s "$T/a" - \
    && ok || bad "m4 --act f32: batch 7 differs from batch 1"

# ---- the MoE faults: each comparison fails when both of its runs carry the fault
REF1="--batch 1 --threads 1 --isa scalar"
for m in m32 m4 k3; do
    fault_breaks $m moe-capacity "$REF1" "--batch 8"
    fault_breaks $m moe-capacity "$REF1" "--batch 8" reversed
    fault_breaks $m moe-capacity "$REF1" "$REF1 --prefill-chunk 1"
done
fault_breaks k3 moe-combine-by-load "$REF1" "--batch 8"
fault_breaks k3 moe-combine-by-load "$REF1" "--batch 8" reversed
fault_breaks k3 moe-combine-by-load "$REF1" "$REF1 --prefill-chunk 1"
for f in rope-scalar-offset gemv-gemm row-order; do fault_breaks m4 $f "$REF1" "--batch 8"; done
for m in m32 m4 k3; do
    "$BIN" generate -m "$T/$m" --prompts-file "$PF" -n 8 --ignore-eos --batch 8 --check-serial > "$T/cs" 2>&1 \
        && ok || bad "$m: --check-serial: $(tail -2 "$T/cs")"
    faults="moe-capacity"; [ $m = k3 ] && faults="moe-capacity moe-combine-by-load"
    for f in $faults; do
        "$BIN" generate -m "$T/$m" --prompts-file "$PF" -n 8 --ignore-eos --batch 8 --check-serial --inject $f > "$T/cs" 2>&1
        rc=$?
        [ $rc = 1 ] && grep -q "differs from its serialized run" "$T/cs" && ok || bad "$m: --check-serial --inject $f: exit $rc"
    done
done

# ---- transformers' expert layout (gate_up_proj [E, 2Fm, D], down_proj [E, D, Fm]) gives the same bits
if [ -n "$PY" ]; then
    cp -r "$T/m32" "$T/hf"
    "$PY" - "$T/hf/model.safetensors" <<'PYEOF'
import json, struct, sys
import numpy as np
p = sys.argv[1]
with open(p, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
T = {}
for k, e in h.items():
    if k == "__metadata__":
        continue
    a, b = e["data_offsets"]
    T[k] = (e["dtype"], np.frombuffer(data[a:b], dtype="<f4" if e["dtype"] == "F32" else "<u2").reshape(e["shape"]))
for k in [k for k in T if k.endswith("experts.switch_glu.gate_proj.weight")]:
    pre = k[: -len("switch_glu.gate_proj.weight")]
    g, u, d = (T.pop(pre + "switch_glu.%s_proj.weight" % w)[1] for w in ("gate", "up", "down"))
    T[pre + "gate_up_proj"] = ("F32", np.concatenate([g, u], axis=1))
    T[pre + "down_proj"] = ("F32", d)
hdr, off, blobs = {}, 0, []
for k in sorted(T):
    dt, a = T[k]; b = a.tobytes()
    hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}; off += len(b); blobs.append(b)
hs = json.dumps(hdr).encode(); hs += b" " * ((8 - len(hs) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(hs)) + hs + b"".join(blobs))
PYEOF
    a=$(gen "$T/m32" --batch 4 | grep -o '"digest":"[0-9a-f]*"'); b=$(gen "$T/hf" --batch 4 | grep -o '"digest":"[0-9a-f]*"')
    [ -n "$a" ] && [ "$a" = "$b" ] && ok || bad "transformers' expert layout: digests differ from mlx-lm's: $(cat "$T/gen.err")"
fi

# ---- MoE config errors: one line naming the field, exit 1
badcfg 'del c["num_experts"]' "field num_experts: missing"
badcfg 'del c["top_k_experts"]' "field top_k_experts: missing"
badcfg 'del c["moe_intermediate_size"]' "field moe_intermediate_size: missing"
badcfg 'c["top_k_experts"]=9' "field top_k_experts: 9 exceeds num_experts 8"
badcfg 'c["enable_moe_block"]=False' "field num_experts: set but enable_moe_block is false"
badcfg 'c["num_experts"]=4' "tensor model.layers.0.router.per_expert_scale"
badcfg 'c["moe_intermediate_size"]=32' "experts.switch_glu"
for f in num_shared_experts n_shared_experts norm_topk_prob router_aux_loss_coef moe_layer_freq \
         first_k_dense_replace routed_scaling_factor expert_capacity capacity_factor; do
    badcfg "c[\"$f\"]=1" "field $f"
done
# ---- diff: clean, and the MoE faults' first divergence at the routed experts' output
"$BIN" diff -m "$T/k3" > "$T/d" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^no divergence" "$T/d" && ok || bad "diff clean on the MoE model: exit $rc"
for f in moe-capacity moe-combine-by-load; do
    "$BIN" diff -m "$T/k3" --inject $f > "$T/d" 2>&1; rc=$?
    [ $rc = 1 ] && grep -q "^first divergence: step 0, layer 0, point moe_out: sub-op moe" "$T/d" && ok \
        || bad "diff --inject $f: exit $rc, $(grep '^first' "$T/d")"
done
# ---- probe: the op-table check (every op, the MoE block's against each row routed alone) clean, and
# failing at the moe op under each MoE fault
"$BIN" probe -m "$T/k3" --backend cpu > "$T/p" 2>&1; rc=$?
[ $rc = 0 ] && grep -q "^backend op table: every op bitwise equal" "$T/p" && grep -qE "cpu scalar +q8 +[0-9]+ ops" "$T/p" \
    && ok || bad "probe on the MoE model: exit $rc, $(tail -1 "$T/p")"
for f in moe-capacity moe-combine-by-load; do
    "$BIN" probe -m "$T/k3" --backend cpu --inject $f > "$T/p" 2>&1; rc=$?
    [ $rc = 1 ] && grep -qE "^  cpu scalar +q8 +moe .*DIFFER" "$T/p" && grep -q "^backend op table: FAILED" "$T/p" && ok \
        || bad "probe --inject $f: exit $rc, $(tail -1 "$T/p")"
done

# ---- accuracy: the engine against the C float64 reference (src/diag/reference.c) over 60 tokens,
# past the window: f32 agrees on every argmax and within 1e-5 relative L2
"$BIN" accuracy -m "$T/m32" --tokens 60 --act f32 --json > "$T/acc" 2>&1
grep -qF '"top1_agree":60,' "$T/acc" && awk -F'"rel_l2":' '{split($2, a, /[,}]/); exit !(a[1] + 0 > 0 && a[1] + 0 < 1e-5)}' "$T/acc" \
    && ok || bad "accuracy on m32: $(cat "$T/acc")"
echo "t_gemma4_moe: $pass passed, $fail failed"
[ $fail = 0 ]

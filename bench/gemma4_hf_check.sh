#!/usr/bin/env bash
# gemma4_hf_check.sh BUILD_DIR OUT_DIR — isobatch's Gemma 4 logits against transformers' Gemma4ForCausalLM
# in float64 (bench/gemma4_hf_check.py; docs/gemma4.md "Against transformers"), run from the
# repository root on a machine with torch and transformers:
#   1. every case (tiny dense 4-bit and float32, tiny MoE top-2 4-bit and top-3 8-bit, Gemma-4-26B-A4B's
#      real shapes on its first 6 layers at 8 bits): each must PASS (relative L2 <= 1e-5, top-1 100%);
#   2. the same check on the tiny dense model with one HF weight changed by 1% (--perturb): it must FAIL,
#      so the check is shown able to fail.
# Writes OUT_DIR/check.log, OUT_DIR/summary.json, OUT_DIR/perturb.log, OUT_DIR/perturb.json. Exit 0 when
# both hold. Extra arguments go to both runs (e.g. --cases dense,moe, --real-layers 4, --device cpu; the
# perturbed run keeps its own --cases dense); --hf-standin numpy tests the scripts without torch.
# The isobatch binary's shared libraries: LD_LIBRARY_PATH set by the caller, or --isobatch-libs DIR
# (for the isobatch processes only, so torch keeps its own); PYTHON picks the interpreter.
set -u
if [ $# -lt 2 ]; then
    echo "usage: $0 BUILD_DIR OUT_DIR [gemma4_hf_check.py options]" >&2
    exit 2
fi
BUILD=$1; OUT=$2; shift 2
PY=${PYTHON:-python3}
BIN=$BUILD/isobatch
[ -x "$BIN" ] || { echo "$BIN: not an executable" >&2; exit 2; }
mkdir -p "$OUT" || exit 2

"$PY" bench/gemma4_hf_check.py --isobatch "$BIN" --work "$OUT/work" --json "$OUT/summary.json" "$@" 2>&1 \
    | tee "$OUT/check.log"
rc=${PIPESTATUS[0]}

"$PY" bench/gemma4_hf_check.py --isobatch "$BIN" "$@" --work "$OUT/work_perturb" --cases dense --perturb \
    --json "$OUT/perturb.json" > "$OUT/perturb.log" 2>&1
prc=$?
if [ "$prc" = 1 ] && grep -q "^  dense    FAIL" "$OUT/perturb.log"; then
    echo "perturbed run: FAIL, as it must (the check can fail): $(grep '^  dense' "$OUT/perturb.log")"
    perturb_ok=1
else
    echo "perturbed run: exit $prc, expected 1 with the dense case FAIL: the check did not show it can fail"
    tail -5 "$OUT/perturb.log"
    perturb_ok=0
fi

if [ "$rc" = 0 ] && [ "$perturb_ok" = 1 ]; then
    echo "gemma4_hf_check.sh: PASS (every case within tolerance; the perturbed run failed)"
    exit 0
fi
echo "gemma4_hf_check.sh: FAIL (check exit $rc, perturbed run $([ "$perturb_ok" = 1 ] && echo failed as it must || echo 'did not fail'))"
exit 1

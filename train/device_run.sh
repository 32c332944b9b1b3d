#!/bin/bash
# device_run.sh — the whole run on the GPU machine: tokenizer, training, export, evaluation.
# Needs train/data/ (train/make_corpus.sh) and $OUT (where results go; default train/out/device).
# Extra arguments go to train.py (e.g. --resume DIR --steps N). TOKENIZER=DIR reuses a trained tokenizer.
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")"
OUT=${OUT:-$PWD/out/device}
mkdir -p out "$OUT"
(
  set -e
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv || true
  python3 -c "import torch, tokenizers; print('torch', torch.__version__, 'tokenizers', tokenizers.__version__)"
  if [ -n "$TOKENIZER" ]; then mkdir -p out/tokenizer && cp "$TOKENIZER"/tokenizer*.json out/tokenizer/;
  else python3 train_tokenizer.py --out out/tokenizer; fi
  python3 train.py --tokenizer out/tokenizer --out out --ckpt-dir "$OUT/ckpt" "$@"
  python3 export_mlx.py --ckpt "$OUT/ckpt" --tokenizer out/tokenizer --out out/model
  cp out/model/model.safetensors "$OUT/"
  python3 eval.py --ckpt "$OUT/ckpt" --data out/eval_data.json --out out/eval_float.json
  python3 eval.py --model out/model --data out/eval_data.json --out out/eval_q4.json
) 2>&1 | tee "$OUT/log.txt"
cp "$OUT/log.txt" out/log.txt
tar czf "$OUT/results.tgz" out/tokenizer out/model/config.json out/eval_data.json out/eval_*.json out/log.txt
ls -la "$OUT" "$OUT/ckpt"

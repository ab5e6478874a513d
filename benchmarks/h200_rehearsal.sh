#!/usr/bin/env bash
# Issue 26, item 5: the one prepared device run of the rehearsal (at most 9 minutes of device
# time): one registered depth partition of qwen2.5-7b's primary block (1,800 documents) scored
# by the product's scoring loop with Qwen2.5-7B's full configuration, random weights, bf16, and
# two of its documents again on the host CPU in float32 (benchmarks/rehearsal_gpu.py).
# Carry: data/cache/rehearsal_models/Qwen--Qwen2.5-7B-Instruct (the registered tokenizer; built
# by `fear rehearse`) and, where the device image lacks this project's transformers, .whl/.
# Every figure and log goes to $OUT.
set -uo pipefail
OUT="${OUT:-benchmarks/results}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/device.txt"
timeout "${SCORE_S:-480}" python3 benchmarks/rehearsal_gpu.py --depth "${DEPTH:-d4}" --agreement "${AGREEMENT:-2}" \
  2>&1 | tee "$OUT/rehearsal_gpu.log"
cp benchmarks/results/rehearsal_gpu.json "$OUT/" 2>/dev/null || echo "no rehearsal_gpu.json written"

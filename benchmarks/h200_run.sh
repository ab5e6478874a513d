#!/usr/bin/env bash
# The one prepared run on a lent H200 (issues 11 and 14): the LM engine's GPU figures
# (benchmarks/gpu.py) and the power simulation's vectorised sampler at registered size
# (benchmarks/power_gpu.py). The device image has torch, JAX (CUDA), optax and numpy; the
# transformers release this project tests with and BlackJAX travel as wheels in .whl/, and
# the registered model's exported log density in .gpu_power/ (made here by
# `benchmarks/power_gpu.py export`). Every figure and log goes to $OUT.
set -uo pipefail
OUT="${OUT:-benchmarks/results}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, transformers, jax; print('torch', torch.__version__, 'transformers', transformers.__version__, 'jax', jax.__version__, jax.devices())" | tee -a "$OUT/device.txt"
uptime | tee -a "$OUT/device.txt"
GPU_S="${GPU_S:-200}"; POWER_S="${POWER_S:-280}"
timeout "$GPU_S" python3 benchmarks/gpu.py 2>&1 | tee "$OUT/gpu.log"
cp benchmarks/results/gpu.json "$OUT/gpu.json" 2>/dev/null || echo "no gpu.json written"
python3 -c "import blackjax, flatbuffers, optax; print('blackjax', blackjax.__version__)" | tee -a "$OUT/device.txt"
timeout "$POWER_S" python3 benchmarks/power_gpu.py run --platform cuda --datasets 16 64 256 \
  --grad-batches 1 64 256 1024 --adapt 250 --warmup 100 --max-seconds $((POWER_S - 40)) 2>&1 | tee "$OUT/power_gpu.log"
ls -la "$OUT"

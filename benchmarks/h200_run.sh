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
GPU_S="${GPU_S:-200}"; POWER_S="${POWER_S:-280}"; CHEES_S="${CHEES_S:-0}"; ADAPTIVE_S="${ADAPTIVE_S:-0}"
python3 -c "import blackjax, flatbuffers, optax; print('blackjax', blackjax.__version__)" | tee -a "$OUT/device.txt"
# A step whose seconds are 0 is off: `timeout 0` would run it without any limit.
if [ "$GPU_S" -gt 0 ]; then
  timeout "$GPU_S" python3 benchmarks/gpu.py 2>&1 | tee "$OUT/gpu.log"
  cp benchmarks/results/gpu.json "$OUT/gpu.json" 2>/dev/null || echo "no gpu.json written"
fi
if [ "$POWER_S" -gt 0 ]; then
  timeout "$POWER_S" python3 benchmarks/power_gpu.py run --platform "${PLATFORM:-cuda}" --datasets 16 64 256 \
    --grad-batches 1 64 256 1024 --adapt 250 --warmup 100 --max-seconds $((POWER_S - 40)) 2>&1 | tee "$OUT/power_gpu.log"
fi
# Issue 28: the registered simulation sampler (jittered HMC tuned once by ChEES, then frozen,
# 4 chains a dataset) on the same export; off unless CHEES_S is set (GPU_S + POWER_S + CHEES_S
# must stay within the device time: e.g. GPU_S=0 POWER_S=200 CHEES_S=280).
if [ "$CHEES_S" -gt 0 ]; then
  timeout "$CHEES_S" python3 benchmarks/power_gpu.py run --platform "${PLATFORM:-cuda}" --algorithm chees_hmc --chains 4 \
    --datasets 64 256 --grad-batches 256 1024 --adapt 500 --warmup 100 --max-seconds $((CHEES_S - 30)) \
    --json power_gpu_chees.json 2>&1 | tee "$OUT/power_gpu_chees.log"
fi
# Issue 28's candidate with every dataset's own warm-up (adaptive_hmc, target acceptance 0.9 as
# validated on CPU); off unless ADAPTIVE_S is set, within the same device-time sum.
# ADAPTIVE_ALGORITHM=adaptive_hmc_dense: the block mass matrix (dense globals, diagonal unit intercepts);
# adaptive_hmc_dense_oas: that block shrunk towards its diagonal (fewer leapfrog steps; diverges on funnels).
if [ "$ADAPTIVE_S" -gt 0 ]; then
  timeout "$ADAPTIVE_S" python3 benchmarks/power_gpu.py run --platform "${PLATFORM:-cuda}" \
    --algorithm "${ADAPTIVE_ALGORITHM:-adaptive_hmc}" \
    --chains 4 --target-accept 0.9 --datasets 64 256 --grad-batches 256 1024 --warmup 400 \
    --max-seconds $((ADAPTIVE_S - 30)) --json power_gpu_adaptive.json 2>&1 | tee "$OUT/power_gpu_adaptive.log"
fi
# Issue 28, every simulated model: each block's registered-size batch on the device with the
# block-metric candidate, the registered remedy, and item 3(a)'s comparison with the nutpie
# references the export holds (`benchmarks/power_gpu_blocks.py export` here first; carry
# .gpu_power_blocks). Off unless BLOCKS_S is set, within the same device-time sum; BLOCKS_ARGS adds
# run's options (--blocks primary, --target-accept 0.95). SURVEY_S: a run at short lengths
# (100 + 100, no extensions) whose seconds per dataset are scaled to the validated lengths, for the
# blocks a lease cannot fit at full length (SURVEY_ARGS: --blocks ...); it runs first, since its time is
# bounded and the full-length run's is not. E.g. one lease:
#   GPU_S=0 POWER_S=0 SURVEY_S=180 SURVEY_ARGS="--blocks recall ... primary" BLOCKS_S=380 BLOCKS_ARGS="--blocks primary"
BLOCKS_S="${BLOCKS_S:-0}"; SURVEY_S="${SURVEY_S:-0}"
if [ "$SURVEY_S" -gt 0 ]; then
  timeout "$SURVEY_S" python3 benchmarks/power_gpu_blocks.py run --platform "${PLATFORM:-cuda}" \
    --warmup 100 --draws 100 --extensions 0 --max-seconds $((SURVEY_S - 20)) \
    --json power_gpu_blocks_survey.json ${SURVEY_ARGS:-} 2>&1 | tee "$OUT/power_gpu_blocks_survey.log"
fi
if [ "$BLOCKS_S" -gt 0 ]; then
  timeout "$BLOCKS_S" python3 benchmarks/power_gpu_blocks.py run --platform "${PLATFORM:-cuda}" \
    --max-seconds $((BLOCKS_S - 30)) ${BLOCKS_ARGS:-} 2>&1 | tee "$OUT/power_gpu_blocks.log"
fi
# Issue 28's item 3(a) at registered size, several scenarios in one lease: VALIDATE_S seconds shared
# by the folders in VALIDATE_ARTEFACTS, each `power_gpu_blocks.py subset --blocks primary --datasets 64
# --without-references` of one scenario's export (made here, with its references; about a third of
# the size, so three fit in the 64 MiB carried). Each folder's draws go to $OUT/draws_<folder> and are
# scored where the references are: `power_gpu_blocks.py rescore --artefacts <its export> --draws ...
# --sbc <the reduced design's validate JSON>`. Name the folders .gpu_power_blocks_lease_<scenario>
# (git ignores .gpu_power_blocks*, so they travel only when carried). E.g.
#   GPU_S=0 POWER_S=0 VALIDATE_S=540 VALIDATE_ARTEFACTS=".gpu_power_blocks_lease_meaningful
#     .gpu_power_blocks_lease_null .gpu_power_blocks_lease_sesoi"
VALIDATE_S="${VALIDATE_S:-0}"
if [ "$VALIDATE_S" -gt 0 ]; then
  read -r -a folders <<< "${VALIDATE_ARTEFACTS:?VALIDATE_ARTEFACTS: the subset folders to fit}"
  each=$((VALIDATE_S / ${#folders[@]}))
  for a in "${folders[@]}"; do
    name=$(basename "$a"); name="${name#.}"
    timeout "$each" python3 benchmarks/power_gpu_blocks.py run --platform "${PLATFORM:-cuda}" --artefacts "$a" \
      --blocks primary --chunk-draws 100 --algorithm "${VALIDATE_ALGORITHM:-adaptive_hmc_dense_pooled}" \
      --max-seconds $((each - 20)) --save-draws "$OUT/draws_$name" --json "power_gpu_blocks_$name.json" \
      2>&1 | tee "$OUT/power_gpu_blocks_$name.log"
  done
fi
ls -la "$OUT"

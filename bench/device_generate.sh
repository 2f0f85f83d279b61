#!/usr/bin/env bash
# MiniMax H3 t2va at real size on one H200, Drainboard against diffusers' own pipeline (bench/bench_h3_generate.py):
#   WHL=.whl bash bench/device_generate.sh                                   # call 1, about 9 minutes
#   WHL=.whl BUDGET=510 ARGS=--resume bash bench/device_generate.sh        # call 2 within ~30 s: reuses the checkpoint
#     and the results in .h3gen/results, runs what call 1 did not reach (on a fresh machine add
#     --runs ours-resident@g2,diffusers-resident@g2,ours-sequential@g2,ours-offload,diffusers-offload to ARGS)
# WHL: a folder of wheels (diffusers 0.42.1, av) installed to /tmp/site first. BUDGET: seconds for the harness
# (default 540). The checkpoint: the DiT in .h3gen/ (disk), the rest in /dev/shm/h3gen. Log: $OUT/generate.txt,
# summary: $OUT/generate_h3.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/drainboard-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/generate.txt") 2>&1
. bench/device_site.sh
unset DRAINBOARD_UNIFIED_MEMORY
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>&1 || true
df -h . /dev/shm 2>&1 | sed 's/^/  /'
grep -E 'MemTotal|MemAvailable' /proc/meminfo
python3 -c "import torch, av, diffusers, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'av', av.__version__)" || exit 1
# shellcheck disable=SC2086
python3 bench/bench_h3_generate.py --work .h3gen --shm /dev/shm/h3gen --device cuda --budget "${BUDGET:-540}" \
  --out "$OUT" ${ARGS:-}

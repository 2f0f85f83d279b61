#!/usr/bin/env bash
# Sharded load on 2 GPUs (issue #7), for the lead to run on nvidia-h200-x2:
#   bash bench/device_sharded.sh
# Writes a >= 16 GiB H3-shaped bf16 checkpoint, then per cache state (warm, cold)
# loads it with one-GPU stream and with 2 ranks each reading only its slices,
# then (--diagnose) loads warm on one rank and on 2 ranks without FSDP, then verifies every
# rank's shards byte for byte and two FSDP gathers. The log ends with a per-phase table
# (group, setup | allocate, read, assign, sync; host MiB above baseline; device peak / share).
# Results: $OUT/sharded.json (everything, written after each run), $OUT/sharded.txt (log). About 4-6 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/drainboard-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/sharded.txt") 2>&1
# NVLink multicast stays off (device docs).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CKPT="${CKPT:-/tmp/drainboard-sharded-h3}"

echo "== GPUs"; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 || true
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda devices', torch.cuda.device_count())"
df -h "$(dirname "$CKPT")" | tail -1
free -g | head -2

time timeout 400 "$PY" bench/bench_sharded.py --out "$CKPT" --size 16 --nproc 2 --cache warm cold --diagnose --verify \
  --json "$OUT/sharded.json"
rc=$?
rm -rf "$CKPT"
exit $rc

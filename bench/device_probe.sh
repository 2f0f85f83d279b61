#!/usr/bin/env bash
# Device probe on a real GPU (issue #3): the driver answers without a CUDA context,
# and the forced unified-memory policy shows its five decisions.
# Usage (repo root, on the GPU machine): bash bench/device_probe.sh
# Writes everything to $OUT/device_probe.txt as well when $OUT is set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  exec > >(tee "$OUT/device_probe.txt") 2>&1
fi
unset DRAINBOARD_UNIFIED_MEMORY

echo "== nvidia-smi"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true

echo "== (a) probe cuda in a fresh interpreter; torch.cuda.is_initialized() must stay False"
"$PY" - <<'PYEOF'
import json
import torch
from loader.device import probe_device
info = probe_device("cuda")
print(json.dumps(info.to_dict(), indent=2))
print("torch.cuda.is_initialized() after probe:", torch.cuda.is_initialized())
PYEOF

if "$PY" -m loader device --help >/dev/null 2>&1; then
  CLI=(-m loader device)
else
  CLI=(-m loader.device_cli)
fi

echo "== (b) python ${CLI[*]} cuda  (what the policy does on this discrete GPU)"
"$PY" "${CLI[@]}" cuda

echo "== (c) DRAINBOARD_UNIFIED_MEMORY=1 python ${CLI[*]} cuda --json"
DRAINBOARD_UNIFIED_MEMORY=1 "$PY" "${CLI[@]}" cuda --json

echo "== (d) GPU tests of the probe"
"$PY" -m pytest -q -m gpu tests/loader/test_device.py 2>&1 | tail -5

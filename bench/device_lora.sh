#!/usr/bin/env bash
# LoRA figures at real size on one H200 (zero-weight sparse checkpoint in /dev/shm; memory and time, not quality):
#   WHL=.whl bash bench/device_lora.sh
#   PY=/work/venv/bin/python DEVICE=cpu PROFILE=tiny QUANT=int8 CANVAS=64x128 STEPS_LIST="2 3" bash bench/device_lora.sh     # a dry run on a CPU
# 1. bench/bench_lora.py: the DiT loaded with a rank-64 all-Linear LoRA merged against without, the same into fp8,
#    and diffusers' own load_lora_adapter + fuse_lora on the same file.
# 2. A whole t2va job with that LoRA merged, at 8 steps and at 50 (`python -m models generate --json`), the same
#    canvas (CANVAS, default 320x576, 124 frames): wall seconds and each stage's peak, then the forecast of the same
#    request against those peaks, stage by stage (bench/compare_forecast.py).
# WHL: wheels (diffusers 0.42.1, av, torchao, peft) installed to /tmp/site first. Log: $OUT/lora.txt; the jobs'
# results: $OUT/lora_job_<steps>.json, their forecasts $OUT/lora_forecast_<steps>.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/drainboard-out}"
PY="${PY:-python3}"; DEVICE="${DEVICE:-cuda}"; PROFILE="${PROFILE:-h3}"
ROOT="${ROOT:-/dev/shm/$PROFILE-sparse}"; LORA="$ROOT-lora-r64.safetensors"
mkdir -p "$OUT" "$ROOT"
exec > >(tee "$OUT/lora.txt") 2>&1
. bench/device_site.sh
"$PY" -c "import torch, diffusers, peft; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'peft', peft.__version__)" || exit 1
if [ -z "${SKIP_LOAD:-}" ]; then
  "$PY" bench/bench_lora.py "$ROOT" --sparse "$PROFILE" --device "$DEVICE" --quantize "${QUANT:-fp8}" --repeat 1 --timeout 240 \
    --json ${LOAD_ARGS:-} || echo "bench_lora failed: $?"
fi
"$PY" - "$ROOT" "$PROFILE" "$LORA" <<'EOF' || exit 1
import sys
from pathlib import Path
sys.path.insert(0, "bench")
from check_forecast_cuda import write_sparse_h3
from bench_lora import write_lora
root = Path(sys.argv[1])
write_sparse_h3(root, sys.argv[2])  # every folder a t2va job reads, the DiT's data holes as in step 1
lora = Path(sys.argv[3])
if not lora.exists():
    write_lora(root, lora, 64)
print("LoRA", lora, lora.stat().st_size, "bytes")
EOF
HW="${CANVAS:-320x576}"
for steps in ${STEPS_LIST:-8 50}; do
  request=("$ROOT" --prompt "a red fox running through fresh snow at dawn" --steps "$steps" --height "${HW%x*}"
           --width "${HW#*x}" --frames 124 --lora "$LORA" --device "$DEVICE" --json)
  started=$(date +%s.%N)
  "$PY" -m models generate "${request[@]}" --out "$ROOT-job-$steps.mp4" > "$OUT/lora_job_$steps.json" 2> "$OUT/lora_job_$steps.err"
  rc=$?
  echo "job at $steps steps: rc $rc, wall $(awk "BEGIN { print $(date +%s.%N) - $started }") s"; tail -3 "$OUT/lora_job_$steps.err"
  "$PY" -c "import json, sys; r = json.load(open(sys.argv[1])); print(json.dumps({k: r.get(k) for k in ('steps', 'stage_seconds', 'stage_peaks')}))" "$OUT/lora_job_$steps.json" || true
  "$PY" -m models forecast "${request[@]}" > "$OUT/lora_forecast_$steps.json" && \
    "$PY" bench/compare_forecast.py "$OUT/lora_forecast_$steps.json" "$OUT/lora_job_$steps.json" || echo "forecast check failed: $?"
done

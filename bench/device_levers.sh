#!/usr/bin/env bash
# The speed levers at real size on one H200 (bench/bench_levers.py), zero-weight sparse checkpoint in /dev/shm:
#   WHL=.whl bash bench/device_levers.sh                         # call 1: the cases that fit in BUDGET seconds
#   WHL=.whl CARRY=.levers_carry bash bench/device_levers.sh     # a later call: unpacks call 1's levers_work.tgz
#                                                                #   from CARRY and runs the rest (--resume)
# WHL: wheels (diffusers 0.42.1, av, torchao, sageattention, peft) installed to /tmp/site first. ARGS: more flags.
# Log: $OUT/levers.txt; the table: $OUT/levers.json; results and MP4s so far: $OUT/levers_work.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/drainboard-out}"
mkdir -p "$OUT" /dev/shm/levers
exec > >(tee "$OUT/levers.txt") 2>&1
. bench/device_site.sh
python3 -c "import torch, diffusers, torchao; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'torchao', torchao.__version__)" || exit 1
RESUME=()
if [ -n "${CARRY:-}" ] && [ -f "$CARRY/levers_work.tgz" ]; then
  tar -xzf "$CARRY/levers_work.tgz" -C /dev/shm/levers && RESUME=(--resume)
fi
# shellcheck disable=SC2086
python3 bench/bench_levers.py --work /dev/shm/levers --device cuda --budget "${BUDGET:-440}" --out "$OUT" \
  --canvas "${CANVAS:-576x1024}" --steps "${STEPS:-4}" --cache-steps "${CACHE_STEPS:-12}" "${RESUME[@]}" ${ARGS:-}
tar -czf "$OUT/levers_work.tgz" -C /dev/shm/levers results $(cd /dev/shm/levers && ls ./*.mp4 2>/dev/null)

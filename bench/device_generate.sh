#!/usr/bin/env bash
# Generate pipeline and H3-sized DiT loads on one H200 (issue #5), for the lead to run on nvidia-h200:
#   bash bench/device_generate.sh
# 1. `demo` generate at 320x192, 121 frames, default steps, bf16 on cuda: offload requested
#    (discrete GPU: the policy keeps layerwise offload) vs the unified-memory settings forced by
#    DRAINBOARD_UNIFIED_MEMORY=1 (every offload flag off). Per-stage seconds and peaks.
# 2. `h3-pruned-r16` DiT only (639 tensors, 37.56 GiB bf16) written once, loaded to cuda in
#    retain, drain and stream (footprint ratio, throughput), then deleted (64 GiB disk).
# Results: $OUT/generate_*.json, $OUT/load_*.json, $OUT/generate.txt (log), $OUT/clip_*.mp4.
# Needs torch with CUDA plus av, safetensors, psutil importable by $PYTHON. About 4-6 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/drainboard-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/generate.txt") 2>&1
DEMO="${DEMO:-/tmp/drainboard-demo}"
H3="${H3:-/tmp/drainboard-h3-pruned}"
unset DRAINBOARD_UNIFIED_MEMORY

echo "== GPU"; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 || true
"$PY" -c "import torch, av, safetensors; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'av', av.__version__)"
df -h /tmp | tail -1; free -g | head -2

echo "== demo checkpoint"
time "$PY" -m models synth "$DEMO" --profile demo

GEN=(generate "$DEMO" --prompt "a red fox running through fresh snow at dawn" --frames 121 --width 320 --height 192
     --device cuda --json)
echo "== demo generate, offload requested (discrete H200)"
time "$PY" -m models "${GEN[@]}" --out "$OUT/clip_offload.mp4" > "$OUT/generate_offload.json"
echo "== demo generate, unified-memory policy forced (DRAINBOARD_UNIFIED_MEMORY=1)"
time env DRAINBOARD_UNIFIED_MEMORY=1 "$PY" -m models "${GEN[@]}" --out "$OUT/clip_unified.mp4" > "$OUT/generate_unified.json"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
for tag in ("offload", "unified"):
    r = json.load(open(f"{out}/generate_{tag}.json"))
    print(f"-- {tag}: offload flags on: {[k for k, v in r['offload'].items() if v and k.endswith('offload')]}")
    for stage, seconds in r["stage_seconds"].items():
        print(f"   {stage:<18} {seconds:7.2f} s   peak {r['stage_peaks'].get(stage, 0) / 2**30:7.2f} GiB")
PYEOF
rm -rf "$DEMO"

echo "== h3-pruned-r16 DiT (transformer only)"
time "$PY" -m models synth "$H3" --profile h3-pruned-r16 --components transformer
for mode in stream drain retain; do
  echo "== load $mode"
  sync; "$PY" -m loader load "$H3" --component transformer --mode "$mode" --device cuda --dtype bf16 --json \
    > "$OUT/load_$mode.json"
  "$PY" -c "import json,sys; r=json.load(open(sys.argv[1])); print({k: r.get(k) for k in ('mode','tensors_placed','bytes_placed','footprint_ratio','host_peak_ratio','memavailable_cost_ratio','load_seconds','throughput_gbps')})" "$OUT/load_$mode.json"
done
rm -rf "$H3"

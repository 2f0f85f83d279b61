#!/usr/bin/env bash
# MiniMax H3 generate (diffusers' t2va pipeline) on one H200 under each offload policy, for nvidia-h200:
#   bash bench/device_generate.sh
# 1. writes the `demo` checkpoint (random weights of the real architecture);
# 2. `demo` generate, 124 frames at the checkpoint's default canvas, 8 steps, bf16 on cuda:
#    a. offload requested on the discrete GPU (policy keeps dit_layerwise_offload = diffusers group offload,
#       model-level offload of text encoder and VAEs; sequential_components off, its default there);
#    b. the same with --sequential-components (each component loaded before its first block, freed after);
#    c. the unified-memory policy forced (DRAINBOARD_UNIFIED_MEMORY=1): every flag off, sequential on;
# 3. forecast vs measured per stage for (c) (bench/bench_generate.py).
# Prints per-stage seconds and peaks (VmRSS + CUDA allocated) and whether the frames are identical.
# Results: $OUT/generate_*.json, $OUT/forecast_unified.json, $OUT/generate.txt (log). Needs torch with CUDA,
# transformers 5.x, diffusers 0.42 and av importable by $PYTHON (carry the last two as wheels).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/drainboard-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/generate.txt") 2>&1
DEMO="${DEMO:-/tmp/drainboard-demo}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
unset DRAINBOARD_UNIFIED_MEMORY

echo "== GPU"; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 || true
"$PY" -c "import torch, av, diffusers, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'diffusers', diffusers.__version__, 'transformers', transformers.__version__, 'av', av.__version__)"

echo "== demo checkpoint"
time "$PY" -m models synth "$DEMO" --profile demo

GEN=(generate "$DEMO" --prompt "a red fox running through fresh snow at dawn" --steps 8 --device cuda --json)
echo "== a. offload requested (discrete H200)"
time "$PY" -m models "${GEN[@]}" --out "$OUT/clip_offload.mp4" > "$OUT/generate_offload.json"
echo "== b. offload requested + sequential components"
time "$PY" -m models "${GEN[@]}" --sequential-components --out "$OUT/clip_sequential.mp4" > "$OUT/generate_sequential.json"
echo "== c. unified-memory policy forced (DRAINBOARD_UNIFIED_MEMORY=1)"
time env DRAINBOARD_UNIFIED_MEMORY=1 "$PY" -m models "${GEN[@]}" --out "$OUT/clip_unified.mp4" > "$OUT/generate_unified.json"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
out = sys.argv[1]
runs = {tag: json.load(open(f"{out}/generate_{tag}.json")) for tag in ("offload", "sequential", "unified")}
for tag, r in runs.items():
    print(f"-- {tag}: {r['width']}x{r['height']}, {r['frames']} frames, sequential={r['sequential_components']},"
          f" placements {{{', '.join(f'{c}: {p['mechanism']}' for c, p in r['placements'].items())}}}")
    for stage in r["stages"]:
        print(f"   {stage:<28} {r['stage_seconds'][stage]:7.2f} s   peak {r['stage_peaks'].get(stage, 0) / 2**30:7.3f} GiB")
    print(f"   total {sum(r['stage_seconds'].values()):.2f} s, peak {max(r['stage_peaks'].values()) / 2**30:.3f} GiB,"
          f" video_sha256 {r['video_sha256'][:16]}")
digests = {r["video_sha256"] for r in runs.values()}
print("same frames under every policy:", len(digests) == 1)
PYEOF
echo "== d. forecast vs measured, unified policy"
DRAINBOARD_UNIFIED_MEMORY=1 "$PY" bench/bench_generate.py "$DEMO" --device cuda --steps 8 --json "$OUT/forecast_unified.json"
rm -rf "$DEMO"

#!/usr/bin/env bash
# Cold CUDA `stream` load against the raw cold read on a 16 GiB bf16 checkpoint (issue #2's
# "cold read_efficiency >= 0.9"), for the default stream settings and three variants, in one go.
#
#   bash bench/device_cold.sh            # on the GPU host, repo root, as root (drop_caches)
#
# Writes $OUT/cold.txt (every run's table plus a compact summary at the end) and $OUT/cold.json.
# About 4 minutes on a 16-core H200 host: the write and its sync (~1 min), then
#   default   stream + drain, warm + cold           (~65 s)
#   no-ra     readahead_bytes=0, warm + cold         (~40 s)  what the WILLNEED window buys
#   seq-bufs  threads=4 staging_buffers=5, cold      (~25 s)  one sequential reader per buffer
#   2x64      staging_bytes=64MiB staging_buffers=2, cold (~25 s)  the old geometry, pipelined
# Env: OUT (default /tmp/device_cold), CKPT (default /tmp/h16c), PYTHON (default python3);
# SIZE, SHARD and DEVICE (16GiB, 3.5GiB, cuda) only for a dry run of the script elsewhere.
set -euo pipefail
OUT=${OUT:-/tmp/device_cold}
CKPT=${CKPT:-/tmp/h16c}
PY=${PYTHON:-python3}
SIZE=${SIZE:-16GiB}
SHARD=${SHARD:-3.5GiB}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
: > "$OUT/cold.txt"
log() { echo "$*" | tee -a "$OUT/cold.txt"; }

start=$(date +%s)
if [ ! -e "$CKPT/config.json" ]; then
  log "writing $SIZE to $CKPT"
  "$PY" -c "
import sys; sys.path.insert(0, 'bench')
from pathlib import Path
from bench_load import make_checkpoint, parse_size
make_checkpoint(Path('$CKPT'), parse_size('$SIZE'), parse_size('$SHARD'))
"
  sync
fi
log "checkpoint ready after $(( $(date +%s) - start )) s: $(du -sh "$CKPT" | cut -f1)"

# From here a failing variant is reported and the others still run.
set +e
run() {  # run NAME TIMEOUT_S BENCH_ARGS...
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  log "== $name: $*"
  timeout "$limit" "$PY" bench/bench_load.py "$CKPT" --device "$DEVICE" --label "$name" --json "$OUT/cold_$name.json" "$@" \
    2>>"$OUT/cold_$name.err" | tee -a "$OUT/cold.txt"
  log "   ($name: rc ${PIPESTATUS[0]}, $(( $(date +%s) - t0 )) s)"
}
run default 120 --cases stream drain --cache warm cold
run no-ra 80 --cases stream --cache warm cold --stream-option readahead_bytes=0
run seq-bufs 60 --cases stream --cache cold --stream-option threads=4 --stream-option staging_buffers=5
run 2x64 60 --cases stream --cache cold --stream-option staging_bytes=64MiB --stream-option staging_buffers=2

"$PY" - "$OUT" <<'EOF' | tee -a "$OUT/cold.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = [json.loads((out / f"cold_{n}.json").read_text()) for n in ("default", "no-ra", "seq-bufs", "2x64") if (out / f"cold_{n}.json").exists()]
(out / "cold.json").write_text(json.dumps({"runs": runs}, indent=2))
print("\n| settings | case | cache | throughput_gbps | raw_read_gbps | read_efficiency | footprint_ratio | load_seconds |")
print("|---|---|---|---|---|---|---|---|")
for run in runs:
    for row in run["medians"]:
        columns = ("throughput_gbps", "raw_read_gbps", "read_efficiency", "footprint_ratio", "load_seconds")
        cells = [row["error"][:80]] + [""] * 4 if "error" in row else [f"{row[c]:.3f}" for c in columns]
        print(f"| {run['label']} | {row['case']} | {row['cache']} | " + " | ".join(cells) + " |")
EOF
log "total $(( $(date +%s) - start )) s"

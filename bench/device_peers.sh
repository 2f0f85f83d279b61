#!/usr/bin/env bash
# One GPU-host call: the peer table (bench/bench_peers.py) on the 37.56 GiB pruned-r16 DiT shapes, plus the
# `gpu`-marked loader tests. Run from the repo root, as root (drop_caches), with the peer wheels in $WHL:
#
#   WHL=.whl bash bench/device_peers.sh              # PHASE=all (default): the peer table, warm, tmpfs and cold, ~6 min
#       # (ROUNDS=N runs every case list N times over, interleaved, and adds a table of medians;
#       #  CACHES="warm tmpfs" picks the cache states, to fit several rounds into one call; COLD_CASES="..." the
#       #  cold list; EXTRA_CASES="stream[staging_buffers=12]" adds warm cases, e.g. a variant beside the default)
#   WHL=.whl PHASE=goals bash bench/device_peers.sh   # the loader's goals in one call, <= 9 min (DEADLINE=520):
#       # 3 interleaved fresh-process rounds warm (ceil_h2d, stream, stream_unregistered, instanttensor_buffered,
#       # KvikIO) and from tmpfs (stream, InstantTensor's default, which is mmap there, KvikIO), one round cold
#       # (ceil_direct, stream, KvikIO with O_DIRECT), then the medians and each goal's ratio (--goals-from);
#       # KVIKIO_WARM / KVIKIO_TMPFS / KVIKIO_COLD replace the KvikIO variants, GPU_TESTS="" skips the gpu tests
#   WHL=.whl PHASE=explore VARIANTS="COPY_QUEUE=1 staging_buffers=12" bash bench/device_peers.sh
#       # ring variants round-robin in one process (bench/bench_ring_variants.py), then stream against the
#       # fastest peers, warm and tmpfs, ~4 min; TMPFS_VARIANTS="..." also runs variants on a copy in /dev/shm,
#       # CONTENTION=1 first runs bench/bench_h2d_contention.py (copy rate by size, beside reads), CASES="" skips
#       # the fresh-process table
#
# Peers are benchmark-only installs, never requirements: instanttensor 0.2.2, fastsafetensors 0.5.0 and
# runai-model-streamer 0.17.1 go to /tmp/site (compiled to bytecode by pip, as bench_peers.py compiles the loader); safetensors 0.9.0rc1 to /tmp/st09, put first on the path of
# the st_prefetch child only (the loader keeps the host's safetensors). Wheels, downloaded elsewhere with:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d $WHL \
#     instanttensor==0.2.2 safetensors==0.9.0rc1 fastsafetensors==0.5.0 runai-model-streamer==0.17.1
# KvikIO (PHASE=goals; optional, never a requirement) matches the host torch's CUDA major (cu12 or cu13):
#   kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 nvidia-cufile==1.20.0.107   (or kvikio-cu12==26.10.0
#   libkvikio-cu12==26.10.0 nvidia-cufile-cu12==1.14.1.1), with rapids-logger==0.3.0 cuda-pathfinder==1.9.1,
#   downloaded with the same pip download command into $WHL.
# Writes $OUT/peers.txt (log + table), $OUT/peers_<phase>.json, $OUT/gpu_tests.txt.
set -uo pipefail
OUT=${OUT:-/tmp/device_peers}
WHL=${WHL:-whl}
CKPT=${CKPT:-/tmp/pruned-r16}
PHASE=${PHASE:-all}
DEADLINE=${DEADLINE:-$([ "${PHASE:-all}" = goals ] && echo 520 || echo 480)}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/peers.txt"; }
start=$(date +%s)

$PY -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site \
  "$WHL"/instanttensor-*.whl "$WHL"/fastsafetensors-*.whl "$WHL"/runai_model_streamer-*.whl 2>&1 | tail -3
$PY -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/st09 "$WHL"/safetensors-0.9*.whl 2>&1 | tail -3
cuda_major=$($PY -c 'import torch; print((torch.version.cuda or "0").split(".")[0])')
kvikio=("$WHL"/kvikio_cu"$cuda_major"-*.whl "$WHL"/libkvikio_cu"$cuda_major"-*.whl "$WHL"/rapids_logger-*.whl "$WHL"/cuda_pathfinder-*.whl)
if [ "$cuda_major" = 12 ]; then kvikio+=("$WHL"/nvidia_cufile_cu12-*.whl); else kvikio+=("$WHL"/nvidia_cufile-*.whl); fi
if ls "${kvikio[@]}" >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/site "${kvikio[@]}" 2>&1 | tail -3
else
  echo "kvikio wheels for CUDA $cuda_major not all in $WHL: the kvikio cases will fail to import"
fi
# libcufile from the nvidia-cufile wheel, for a KvikIO that finds it by soname
for d in /tmp/site/nvidia/*/lib /tmp/site/nvidia/cu*/lib; do [ -d "$d" ] && LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; done
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
log "host: $(nproc) cores, $(grep MemTotal /proc/meminfo), /dev/shm $(df -h /dev/shm | tail -1 | awk '{print $4}') free, $(uname -r)"
log "$(nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader)"
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 | tr 'A-Z' 'a-z')
log "cpu: $(lscpu | sed -n 's/^Model name: *//p'), L3 $(lscpu | sed -n 's/^L3 cache: *//p')"
log "numa: $(ls -d /sys/devices/system/node/node* | wc -l) node(s), GPU ${bus: -12} on node $(cat "/sys/bus/pci/devices/${bus: -12}/numa_node" 2>/dev/null); $(dirname "$CKPT") is $(df -T "$(dirname "$CKPT")" | tail -1 | awk '{print $2}')"
log "torch $($PY -c 'import torch; print(torch.__version__)'), safetensors $($PY -c 'import safetensors; print(safetensors.__version__)')"

if [ "$PHASE" != goals ] || [ -n "${GPU_TESTS-1}" ]; then
  # the goals phase runs the ring's bit-for-bit and refused-registration tests only (time)
  select=(); [ "$PHASE" = goals ] && select=(-k "bit_for_bit or refused_registration")
  $PY -m pytest -q -m gpu --noconftest tests/loader/test_stream_ring.py -p no:cacheprovider "${select[@]}" > "$OUT/gpu_tests.txt" 2>&1
  log "gpu tests: $(tail -1 "$OUT/gpu_tests.txt")"
fi

if [ ! -e "$CKPT/config.json" ]; then
  $PY bench/bench_peers.py --make-checkpoint "$CKPT" 2>&1 | tee -a "$OUT/peers.txt"
  t=$(date +%s); sync; log "sync: $(( $(date +%s) - t )) s"
fi
log "checkpoint: $(du -sh "$CKPT" | cut -f1), $(ls "$CKPT"/*.safetensors | wc -l) shards, ready after $(( $(date +%s) - start )) s"

left=$(( DEADLINE - ($(date +%s) - start) ))
common=("$CKPT" --prefetch-site /tmp/st09 --deadline "$left" --case-timeout 90 --rounds "${ROUNDS:-1}")
set -f  # case lists such as kvikio[threads=16] are words, not glob patterns
case "$PHASE" in
  goals)
    # shellcheck disable=SC2086  # the KVIKIO_* lists are word lists
    $PY bench/bench_peers.py "$CKPT" --deadline "$(( left - 100 ))" --case-timeout 60 --rounds 3 --cache warm tmpfs \
      --json "$OUT/peers_goals_hot.json" \
      --cases ceil_h2d stream stream_unregistered instanttensor_buffered ${KVIKIO_WARM:-kvikio[threads=16,task_size=16MiB]} \
      --tmpfs-cases stream instanttensor ${KVIKIO_TMPFS:-kvikio[threads=16,task_size=16MiB]} \
      2>>"$OUT/peers.txt" | tee -a "$OUT/peers.txt"
    left=$(( DEADLINE - ($(date +%s) - start) ))
    $PY bench/bench_peers.py "$CKPT" --deadline "$left" --case-timeout 60 --cache cold --json "$OUT/peers_goals_cold.json" \
      --cold-cases ceil_direct stream ${KVIKIO_COLD:-kvikio[threads=16,task_size=16MiB,direct=true]} \
      2>>"$OUT/peers.txt" | tee -a "$OUT/peers.txt"
    $PY bench/bench_peers.py --goals-from "$OUT/peers_goals_hot.json" "$OUT/peers_goals_cold.json" | tee -a "$OUT/peers.txt" ;;
  explore)
    shm=/dev/shm/$(basename "$CKPT")
    if [ -n "${TMPFS_VARIANTS:-}${CONTENTION:-}" ]; then cp -r "$CKPT" "$shm"; fi
    if [ -n "${CONTENTION:-}" ]; then
      $PY bench/bench_h2d_contention.py "$CKPT" "$shm" 2>&1 | tee -a "$OUT/peers.txt"
    fi
    # shellcheck disable=SC2086  # VARIANTS, TMPFS_VARIANTS, CASES and TMPFS_CASES are word lists
    $PY bench/bench_ring_variants.py "$CKPT" "" ${VARIANTS:-} --reps "${REPS:-5}" 2>&1 | tee -a "$OUT/peers.txt"
    if [ -n "${TMPFS_VARIANTS:-}" ]; then
      log "tmpfs variants, $shm:"
      $PY bench/bench_ring_variants.py "$shm" "" $TMPFS_VARIANTS --reps "${REPS:-5}" 2>&1 | tee -a "$OUT/peers.txt"
    fi
    rm -rf "$shm"
    [ "${CASES-unset}" = "" ] || $PY bench/bench_peers.py "${common[@]}" --cache warm tmpfs --json "$OUT/peers_explore.json" \
      --cases ${CASES:-ceil_h2d ceil_read stream instanttensor_buffered instanttensor_mmap st_prefetch stream} \
      --tmpfs-cases ${TMPFS_CASES:-stream instanttensor_buffered st_prefetch stream} \
      2>>"$OUT/peers.txt" | tee -a "$OUT/peers.txt" ;;
  *)
    # shellcheck disable=SC2086  # CACHES, COLD_CASES and EXTRA_CASES are word lists
    $PY bench/bench_peers.py "${common[@]}" --cache ${CACHES:-warm tmpfs cold} --json "$OUT/peers_all.json" \
      --cases ceil_h2d ceil_read stream instanttensor_buffered instanttensor_mmap st_prefetch stream \
              instanttensor_buffered ${EXTRA_CASES:-} \
      --tmpfs-cases ceil_read stream instanttensor_buffered st_prefetch fastsafetensors stream instanttensor_buffered \
      --cold-cases ${COLD_CASES:-ceil_direct ceil_direct_seq stream instanttensor fastsafetensors} \
      2>>"$OUT/peers.txt" | tee -a "$OUT/peers.txt" ;;
esac
log "total $(( $(date +%s) - start )) s"

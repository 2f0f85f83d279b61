# Sourced by the device scripts (bench/device_*.sh): WHL, a folder of wheels (diffusers, av, torchao, peft, ...),
# installed to /tmp/site and put on PYTHONPATH (the GPU host has no network); no hub at run time; unbuffered logs;
# the GPU named in the log.
if [ -n "${WHL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || true

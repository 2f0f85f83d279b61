"""Device probe: what a job runs on, and whether its memory is shared with the host.

The answer decides the offload policy (`machine.offload`), so it must be right
and it must be cheap: for CUDA it asks the driver (`libcuda.so.1`) through
ctypes for `CU_DEVICE_ATTRIBUTE_INTEGRATED`, which needs `cuInit` but no CUDA
context. Asking torch (`get_device_properties(...).is_integrated`) would create
one, so torch is asked only when this process already has a context.

`cuInit` in a process that later forks leaves the child unable to use CUDA, so
probe in the process that runs the job (or one that spawns, never forks).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from core.errors import DeviceError

ENV_UNIFIED_MEMORY = "DRAINBOARD_UNIFIED_MEMORY"
"""Environment variable that forces the unified-memory answer: `1` or `0`."""

CU_DEVICE_ATTRIBUTE_INTEGRATED = 18
"""The driver's attribute id for "device is integrated with host memory"."""

_SPEC = re.compile(r"^(cpu|mps|cuda)(?::(\d+))?$")


@dataclass(frozen=True)
class DeviceInfo:
    """What the job runs on, as far as the offload policy cares."""

    spec: str
    """The device spec as given (`cpu`, `cuda`, `cuda:1`, `mps`)."""
    kind: str
    """`cpu`, `cuda` or `mps`."""
    index: int | None
    """CUDA ordinal (0 for a bare `cuda`); None for cpu and mps."""
    name: str
    """Human name: the driver's device name, the CPU model, or `Apple MPS`."""
    unified_memory: bool
    """True when host and device share one memory pool, so moving weights to host frees nothing."""
    total_memory: int | None
    """Bytes of device memory (host RAM for cpu and mps); None when it could not be read."""
    source: str
    """How `unified_memory` was decided: `cuda-driver`, `torch`, `probe-failed`, `cpu`, `mps`,
    or `env:DRAINBOARD_UNIFIED_MEMORY=<value>` when the override forced it."""
    reason: str
    """One sentence saying why, including any probe failure."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_device_spec(spec: str) -> tuple[str, int | None]:
    """Split a spec into (kind, index); a bare `cuda` means ordinal 0."""
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise DeviceError(f"device spec {spec!r} is not understood; expected one of: cpu, cuda, cuda:N, mps")
    kind, index = match.group(1), match.group(2)
    if kind != "cuda":
        return kind, None
    return kind, int(index) if index is not None else 0


def open_libcuda() -> Any:
    """The real CUDA driver library; raises OSError when it is not installed."""
    return ctypes.CDLL("libcuda.so.1")


class _DriverFailure(Exception):
    """A driver call failed; the message says which call and why."""


def probe_device(
    spec: str,
    *,
    open_driver: Callable[[], Any] = open_libcuda,
    environ: Mapping[str, str] | None = None,
) -> DeviceInfo:
    """Probe `spec` without creating a CUDA context.

    `open_driver` returns an object with the driver's C functions as
    attributes (`cuInit`, `cuDeviceGet`, ...), called with ctypes arguments
    and returning CUresult codes, as `ctypes.CDLL("libcuda.so.1")` does.
    Tests pass a fake of it. `environ` defaults to `os.environ`.
    """
    kind, index = parse_device_spec(spec)
    spec = spec.strip()
    if kind == "cpu":
        info = DeviceInfo(
            spec, kind, None, _cpu_name(), True, _host_memory(), "cpu",
            "the target is the CPU: weights already live in host memory, so offloading to host is meaningless",
        )
    elif kind == "mps":
        info = DeviceInfo(
            spec, kind, None, "Apple MPS", True, _host_memory(), "mps",
            "Apple MPS shares one memory pool between CPU and GPU",
        )
    else:
        info = _probe_cuda(spec, index, open_driver)
    return _apply_override(info, os.environ if environ is None else environ)


def _apply_override(info: DeviceInfo, environ: Mapping[str, str]) -> DeviceInfo:
    value = environ.get(ENV_UNIFIED_MEMORY, "").strip()
    if not value:
        return info
    if value not in ("0", "1"):
        raise DeviceError(f"{ENV_UNIFIED_MEMORY}={value!r} is not understood; expected 1 (unified) or 0 (discrete)")
    unified = value == "1"
    forced = "unified memory" if unified else "discrete memory"
    return DeviceInfo(
        info.spec, info.kind, info.index, info.name, unified, info.total_memory,
        f"env:{ENV_UNIFIED_MEMORY}={value}",
        f"{ENV_UNIFIED_MEMORY}={value} forces {forced}; the probe said: {info.reason}",
    )


def _probe_cuda(spec: str, index: int, open_driver: Callable[[], Any]) -> DeviceInfo:
    try:
        lib = open_driver()
    except OSError as exc:
        return _cuda_fallback(spec, index, f"the CUDA driver library could not be opened ({exc})")
    try:
        _check(lib, "cuInit", ctypes.c_uint(0))
        handle = ctypes.c_int(0)
        _check(lib, "cuDeviceGet", ctypes.pointer(handle), ctypes.c_int(index))
        integrated = ctypes.c_int(0)
        _check(
            lib, "cuDeviceGetAttribute",
            ctypes.pointer(integrated), ctypes.c_int(CU_DEVICE_ATTRIBUTE_INTEGRATED), handle,
            what="cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_INTEGRATED)",
        )
    except _DriverFailure as exc:
        return _cuda_fallback(spec, index, str(exc))

    notes = []
    name = f"CUDA device {index}"
    buffer = ctypes.create_string_buffer(256)
    try:
        _check(lib, "cuDeviceGetName", buffer, ctypes.c_int(len(buffer)), handle)
        name = buffer.value.decode(errors="replace") or name
    except _DriverFailure as exc:
        notes.append(f"name unknown: {exc}")
    total: int | None = None
    size = ctypes.c_size_t(0)
    try:
        _check(lib, "cuDeviceTotalMem_v2", ctypes.pointer(size), handle)
        total = size.value
    except _DriverFailure as exc:
        notes.append(f"total memory unknown: {exc}")

    unified = bool(integrated.value)
    reason = (
        f"the CUDA driver reports {name} as integrated: host and GPU share one memory pool"
        if unified
        else f"the CUDA driver reports {name} as a discrete GPU with memory of its own"
    )
    if notes:
        reason += " (" + "; ".join(notes) + ")"
    return DeviceInfo(spec, "cuda", index, name, unified, total, "cuda-driver", reason)


def _check(lib: Any, function: str, *args: Any, what: str | None = None) -> None:
    """Call a driver function, raising _DriverFailure naming it on a missing symbol or an error code."""
    label = what or function
    try:
        call = getattr(lib, function)
    except AttributeError:
        raise _DriverFailure(f"the CUDA driver has no {function}") from None
    code = call(*args)
    if code != 0:
        raise _DriverFailure(f"{label} failed with {_error_name(lib, code)}")


def _error_name(lib: Any, code: int) -> str:
    """`CUDA_ERROR_NO_DEVICE (100)` when the driver can name the code, else `CUresult 100`."""
    text = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(ctypes.c_int(code), ctypes.pointer(text)) == 0 and text.value:
            return f"{text.value.decode()} ({code})"
    except AttributeError:
        pass
    return f"CUresult {code}"


def _cuda_fallback(spec: str, index: int, failure: str) -> DeviceInfo:
    """Ask torch only if this process already has CUDA initialised (asking then creates nothing new)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        try:
            props = torch.cuda.get_device_properties(index)
        except (AssertionError, RuntimeError) as exc:
            failure = f"{failure}; torch could not describe {spec} either ({exc})"
        else:
            unified = bool(getattr(props, "is_integrated", False))
            return DeviceInfo(
                spec, "cuda", index, props.name, unified, int(props.total_memory), "torch",
                f"{failure}; torch (CUDA already initialised) reports {props.name} as "
                + ("integrated" if unified else "discrete"),
            )
    return DeviceInfo(
        spec, "cuda", index, f"CUDA device {index}", False, None, "probe-failed",
        f"{failure}; treating {spec} as discrete, so offload flags stay as set",
    )


def _host_memory() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"

"""Device probe: spec parsing, the CUDA driver path (through a fake of libcuda), failures, overrides."""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from machine import device_cli
from machine.device import CU_DEVICE_ATTRIBUTE_INTEGRATED, DeviceInfo, parse_device_spec, probe_device
from core.errors import DeviceError
from machine.offload import UNIFIED_MEMORY_OFFLOAD_FLAGS

REPO = Path(__file__).resolve().parents[2]

_ERROR_NAMES = {1: b"CUDA_ERROR_INVALID_VALUE", 100: b"CUDA_ERROR_NO_DEVICE", 101: b"CUDA_ERROR_INVALID_DEVICE"}


class FakeCudaDriver:
    """Behaves like `ctypes.CDLL("libcuda.so.1")` for the calls the probe makes.

    Functions take ctypes arguments, write results through pointers and return
    CUresult codes. `errors` maps a function name to the code it returns;
    `missing` names symbols the library lacks (AttributeError, as CDLL raises).
    """

    def __init__(self, *, name=b"NVIDIA GB10", integrated=1, total=128_526_278_656, devices=1,
                 errors=None, missing=(), unknown_attributes=()):
        self.device_name = name
        self.integrated = integrated
        self.total = total
        self.devices = devices
        self.errors = dict(errors or {})
        self.missing = set(missing)
        self.unknown_attributes = set(unknown_attributes)
        self.calls: list[str] = []
        self.initialised = False

    def __getattribute__(self, attr):
        if attr.startswith("cu") and attr in object.__getattribute__(self, "missing"):
            raise AttributeError(f"libcuda.so.1: undefined symbol: {attr}")
        return object.__getattribute__(self, attr)

    def _enter(self, function):
        self.calls.append(function)
        if function != "cuInit" and not self.initialised:
            return 3  # CUDA_ERROR_NOT_INITIALIZED
        return self.errors.get(function, 0)

    def cuInit(self, flags):
        assert isinstance(flags, ctypes.c_uint) and flags.value == 0
        code = self._enter("cuInit")
        self.initialised = code == 0
        return code

    def cuDeviceGet(self, device_ptr, ordinal):
        code = self._enter("cuDeviceGet")
        if code == 0 and ordinal.value >= self.devices:
            return 101
        if code == 0:
            device_ptr.contents.value = ordinal.value
        return code

    def cuDeviceGetAttribute(self, value_ptr, attribute, device):
        code = self._enter("cuDeviceGetAttribute")
        if code == 0 and attribute.value in self.unknown_attributes:
            return 1
        if code == 0:
            assert attribute.value == CU_DEVICE_ATTRIBUTE_INTEGRATED
            value_ptr.contents.value = self.integrated
        return code

    def cuDeviceGetName(self, buffer, length, device):
        code = self._enter("cuDeviceGetName")
        if code == 0:
            buffer.value = self.device_name[: length.value - 1]
        return code

    def cuDeviceTotalMem_v2(self, bytes_ptr, device):
        code = self._enter("cuDeviceTotalMem_v2")
        if code == 0:
            bytes_ptr.contents.value = self.total
        return code

    def cuGetErrorName(self, code, text_ptr):
        if code.value not in _ERROR_NAMES:
            return 1
        text_ptr.contents.value = _ERROR_NAMES[code.value]
        return 0


def opens(driver):
    return lambda: driver


def no_libcuda():
    raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")


NO_ENV: dict[str, str] = {}


@pytest.mark.parametrize(
    "spec, expected",
    [("cpu", ("cpu", None)), ("cuda", ("cuda", 0)), ("cuda:3", ("cuda", 3)), ("mps", ("mps", None)), (" cuda:0 ", ("cuda", 0))],
)
def test_parse_device_spec_accepts_the_four_forms(spec, expected):
    assert parse_device_spec(spec) == expected


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:-1", "cpu:0", "mps:1", "CUDA", ""])
def test_parse_device_spec_rejects_others_naming_the_spec(spec):
    with pytest.raises(DeviceError) as raised:
        parse_device_spec(spec)
    assert repr(spec) in str(raised.value)
    assert "cuda:N" in str(raised.value)


def test_probe_reports_a_gb10_as_unified_from_the_driver():
    driver = FakeCudaDriver()
    info = probe_device("cuda", open_driver=opens(driver), environ=NO_ENV)
    assert info == DeviceInfo(
        spec="cuda", kind="cuda", index=0, name="NVIDIA GB10", unified_memory=True,
        total_memory=128_526_278_656, source="cuda-driver", reason=info.reason,
    )
    assert "integrated" in info.reason
    assert driver.calls[:3] == ["cuInit", "cuDeviceGet", "cuDeviceGetAttribute"]


def test_probe_reports_a_discrete_gpu_from_the_driver():
    driver = FakeCudaDriver(name=b"NVIDIA H200", integrated=0, total=150_000_000_000, devices=2)
    info = probe_device("cuda:1", open_driver=opens(driver), environ=NO_ENV)
    assert (info.kind, info.index, info.name, info.unified_memory, info.total_memory, info.source) == (
        "cuda", 1, "NVIDIA H200", False, 150_000_000_000, "cuda-driver"
    )
    assert "discrete" in info.reason


def test_probe_without_libcuda_says_not_unified_and_why():
    info = probe_device("cuda", open_driver=no_libcuda, environ=NO_ENV)
    assert (info.unified_memory, info.source, info.total_memory) == (False, "probe-failed", None)
    assert "libcuda.so.1: cannot open shared object file" in info.reason


@pytest.mark.parametrize(
    "driver, expected",
    [
        (FakeCudaDriver(errors={"cuInit": 100}), "cuInit failed with CUDA_ERROR_NO_DEVICE (100)"),
        (FakeCudaDriver(devices=1), "cuDeviceGet failed with CUDA_ERROR_INVALID_DEVICE (101)"),
        (
            FakeCudaDriver(unknown_attributes={CU_DEVICE_ATTRIBUTE_INTEGRATED}),
            "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_INTEGRATED) failed with CUDA_ERROR_INVALID_VALUE (1)",
        ),
        (FakeCudaDriver(missing={"cuDeviceGetAttribute"}), "the CUDA driver has no cuDeviceGetAttribute"),
        (FakeCudaDriver(errors={"cuInit": 999}, missing={"cuGetErrorName"}), "cuInit failed with CUresult 999"),
    ],
    ids=["driver-error", "no-such-device", "unknown-attribute", "missing-symbol", "unnamed-error"],
)
def test_probe_driver_failure_says_not_unified_with_the_failing_call(driver, expected):
    spec = "cuda:1" if "INVALID_DEVICE" in expected else "cuda"
    info = probe_device(spec, open_driver=opens(driver), environ=NO_ENV)
    assert info.unified_memory is False
    assert info.source == "probe-failed"
    assert expected in info.reason
    assert f"treating {spec} as discrete" in info.reason


def test_probe_keeps_the_unified_answer_when_only_name_and_size_fail():
    driver = FakeCudaDriver(errors={"cuDeviceGetName": 1}, missing={"cuDeviceTotalMem_v2"})
    info = probe_device("cuda", open_driver=opens(driver), environ=NO_ENV)
    assert (info.unified_memory, info.source, info.name, info.total_memory) == (
        True, "cuda-driver", "CUDA device 0", None
    )
    assert "name unknown: cuDeviceGetName failed with CUDA_ERROR_INVALID_VALUE (1)" in info.reason
    assert "total memory unknown: the CUDA driver has no cuDeviceTotalMem_v2" in info.reason


def test_probe_treats_mps_as_unified():
    info = probe_device("mps", open_driver=no_libcuda, environ=NO_ENV)
    assert (info.kind, info.unified_memory, info.source) == ("mps", True, "mps")


def test_probe_treats_a_cpu_target_like_unified_memory_and_says_offloading_is_meaningless():
    info = probe_device("cpu", open_driver=no_libcuda, environ=NO_ENV)
    assert (info.kind, info.index, info.unified_memory, info.source) == ("cpu", None, True, "cpu")
    assert "meaningless" in info.reason
    assert info.total_memory and info.total_memory > 0


@pytest.mark.parametrize(
    "value, driver, unified",
    [("1", FakeCudaDriver(name=b"NVIDIA H200", integrated=0), True), ("0", FakeCudaDriver(), False)],
)
def test_environment_override_wins_over_the_driver_and_says_so(value, driver, unified):
    info = probe_device("cuda", open_driver=opens(driver), environ={"DRAINBOARD_UNIFIED_MEMORY": value})
    assert info.unified_memory is unified
    assert info.source == f"env:DRAINBOARD_UNIFIED_MEMORY={value}"
    assert info.reason.startswith(f"DRAINBOARD_UNIFIED_MEMORY={value} forces")
    assert "the probe said: the CUDA driver reports" in info.reason


def test_environment_override_applies_to_cpu_and_mps_too():
    assert probe_device("cpu", environ={"DRAINBOARD_UNIFIED_MEMORY": "0"}).unified_memory is False
    assert probe_device("mps", environ={"DRAINBOARD_UNIFIED_MEMORY": "0"}).unified_memory is False


def test_environment_override_with_another_value_is_an_error_naming_the_variable():
    with pytest.raises(DeviceError, match=r"DRAINBOARD_UNIFIED_MEMORY='yes' is not understood; expected 1"):
        probe_device("cpu", environ={"DRAINBOARD_UNIFIED_MEMORY": "yes"})


def test_probe_reads_the_environment_by_default(monkeypatch):
    monkeypatch.setenv("DRAINBOARD_UNIFIED_MEMORY", "0")
    assert probe_device("cpu").source == "env:DRAINBOARD_UNIFIED_MEMORY=0"


_PROBE_SCRIPT = """
import json, sys
from machine.device import probe_device
def refuse():
    raise AssertionError("the CUDA driver was opened for a cpu probe")
spec = sys.argv[1]
info = probe_device(spec, **({"open_driver": refuse} if spec == "cpu" else {}), environ={})
torch = sys.modules.get("torch")
print(json.dumps({
    "info": info.to_dict(),
    "torch_cuda_initialised": bool(torch is not None and torch.cuda.is_initialized()),
    "libcuda_mapped": "libcuda" in open("/proc/self/maps").read(),
}))
"""


def probe_in_fresh_interpreter(spec: str) -> dict:
    """Probe in a new process, so nothing another test did can hide (or cause) a CUDA initialisation."""
    env = {k: v for k, v in os.environ.items() if k != "DRAINBOARD_UNIFIED_MEMORY"}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE_SCRIPT, spec], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_probing_cpu_never_loads_or_initialises_cuda():
    result = probe_in_fresh_interpreter("cpu")
    assert result["info"]["unified_memory"] is True
    assert result["torch_cuda_initialised"] is False
    assert result["libcuda_mapped"] is False


@pytest.mark.gpu
def test_probe_on_a_real_gpu_asks_the_driver_without_creating_a_context():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    result = probe_in_fresh_interpreter("cuda")
    assert result["info"]["source"] == "cuda-driver", result["info"]["reason"]
    assert result["info"]["total_memory"] > 0
    assert result["libcuda_mapped"] is True
    assert result["torch_cuda_initialised"] is False


@pytest.mark.gpu
def test_probe_falls_back_to_torch_only_once_cuda_is_initialised():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.cuda.init()
    info = probe_device("cuda", open_driver=no_libcuda, environ={})
    assert info.source == "torch", info.reason
    assert info.name == torch.cuda.get_device_name(0)
    assert info.unified_memory is bool(torch.cuda.get_device_properties(0).is_integrated)


def test_device_command_prints_one_json_object_with_the_probe_decisions_and_settings(monkeypatch, capsys):
    monkeypatch.setenv("DRAINBOARD_UNIFIED_MEMORY", "1")
    assert device_cli.main(["cuda", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"device", "decisions", "settings"}
    assert out["device"]["source"] == "env:DRAINBOARD_UNIFIED_MEMORY=1"
    assert [d["flag"] for d in out["decisions"]] == list(UNIFIED_MEMORY_OFFLOAD_FLAGS)
    assert all(d["before"] is True and d["after"] is False for d in out["decisions"])
    assert out["settings"]["pin_cpu_memory"] is True


def test_device_command_text_lists_each_decision(monkeypatch, capsys):
    monkeypatch.delenv("DRAINBOARD_UNIFIED_MEMORY", raising=False)
    assert device_cli.main(["cpu"]) == 0
    out = capsys.readouterr().out
    assert "memory:   unified" in out
    assert "  vae_cpu_offload: on -> off (the target is the CPU" in out


def test_device_command_rejects_a_bad_spec_with_exit_code_2(capsys):
    assert device_cli.main(["gpu:0", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert "'gpu:0'" in out["error"]


def test_device_command_registers_into_a_parent_cli(monkeypatch, capsys):
    monkeypatch.delenv("DRAINBOARD_UNIFIED_MEMORY", raising=False)
    parser = argparse.ArgumentParser(prog="python -m loader")
    device_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["device", "mps", "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["device"]["kind"] == "mps"

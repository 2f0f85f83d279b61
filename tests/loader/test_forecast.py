"""`forecast_load`: each mode's peak from metadata alone, its parts, the CLI, and its accuracy
against the measured footprint_ratio of loads in fresh processes."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from core import CheckpointError, DeviceError
from machine.device import DeviceInfo
from machine.memory import sample_memory
from loader.cli import main
from loader.forecast import forecast_load
from loader.model_registry import get_model_builder, register_model_builder
from loader.placement import get_placement
from loader.placement.ring_sizing import ring_geometry

REPO = Path(__file__).resolve().parents[2]
STREAM = get_placement("stream")


def _raw_shard(path: Path, tensors: list[tuple[str, str, list[int], int]]) -> None:
    """A safetensors file whose tensors lie in the given order (name, dtype, shape, nbytes)."""
    header, offset = {}, 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


@pytest.fixture
def crafted(tmp_path) -> Path:
    """Shard 1: a F32[1024] (4 KiB), b BF16[4096] (8 KiB, last); shard 2: c BF16[2048] (4 KiB), d BF16[1024] (2 KiB, last)."""
    folder = tmp_path / "comp"
    folder.mkdir()
    _raw_shard(folder / "m-1.safetensors", [("a", "F32", [1024], 4096), ("b", "BF16", [4096], 8192)])
    _raw_shard(folder / "m-2.safetensors", [("c", "BF16", [2048], 4096), ("d", "BF16", [1024], 2048)])
    return folder


def test_stream_on_cpu_in_the_stored_dtype_is_the_model_alone(crafted):
    f = forecast_load(crafted)
    assert (f.model_bytes, f.bytes_placed, f.checkpoint_bytes, f.largest_shard_bytes) == (18432, 18432, 18432, 12288)
    assert (f.staging_bytes, f.mapped_bytes, f.conversion_bytes) == (0, 0, 0)
    assert f.predicted_peak_bytes == 18432 and f.predicted_footprint_ratio == 1.0


def test_stream_converting_on_cpu_adds_the_staging_buffers(crafted):
    f = forecast_load(crafted, dtype="fp32")
    assert f.model_bytes == 4096 + 4 * (4096 + 2048 + 1024)
    assert f.staging_bytes == 4 * min(STREAM.converting_bytes, 8192)  # 4 buffers sized to the largest staged source
    assert f.predicted_peak_bytes == f.model_bytes + f.staging_bytes


H200 = DeviceInfo(
    spec="cuda", kind="cuda", index=0, name="NVIDIA H200 (fake)", unified_memory=False,
    total_memory=141 * 2**30, source="test", reason="a discrete device for tests",
)


def test_stream_to_cuda_rings_same_dtype_tensors_and_stages_converted_ones_pinned(crafted):
    same = forecast_load(crafted, device="cuda", device_info=H200)  # no device needed to forecast
    geometry = ring_geometry(18432, H200, threads=STREAM.reader_threads(cuda=True),
                             chunk_bytes=STREAM.ring_chunk_bytes, buffers=None, available=sample_memory().mem_available,
                             read_bytes=STREAM.ring_read_bytes)
    pow2 = 1 << (geometry.chunk_bytes - 1).bit_length()
    assert same.staging_bytes == geometry.buffers * pow2 and same.mapped_bytes == 0
    converted = forecast_load(crafted, device="cuda:0", dtype="fp16", device_info=H200)
    # every tensor converts (fp32 a -> fp16 too): 4 pinned buffers sized to b (8 KiB, a power of two) + a device buffer
    assert converted.staging_bytes == 4 * 8192 + 8192 and converted.device == "cuda:0"


def test_drain_peaks_at_the_shard_being_placed_less_its_last_tensor(crafted):
    f = forecast_load(crafted, mode="drain")
    # after c is placed: a, b, c placed (16 KiB) + c still mapped (4 KiB); shard 1's peak (after a) is lower
    assert f.predicted_peak_bytes == 16384 + 4096 and f.mapped_bytes == 2048
    assert f.predicted_peak_bytes <= f.model_bytes + f.largest_shard_bytes


def test_retain_keeps_the_whole_checkpoint_and_a_device_conversion_adds_one_copy(crafted):
    f = forecast_load(crafted, mode="retain")
    assert f.predicted_peak_bytes == 2 * 18432 and f.predicted_footprint_ratio == 2.0
    to_device = forecast_load(crafted, mode="retain", device="cuda", dtype="fp32", device_info=H200)
    assert to_device.conversion_bytes == 4096 * 4  # b, the largest converted tensor, in fp32
    assert forecast_load(crafted, mode="retain", dtype="fp32").conversion_bytes == 0  # CPU converts in place


def test_a_registered_class_keeps_its_fp32_tensors_in_the_forecast(tmp_path):
    if get_model_builder("ForecastKeepFp32ForTests") is None:
        register_model_builder("ForecastKeepFp32ForTests", lambda config: torch.nn.Module(), keep_fp32=(r"norm",))
    folder = tmp_path / "c"
    folder.mkdir()
    save_file({"norm.weight": torch.ones(256), "proj.weight": torch.ones(256)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"_class_name": "ForecastKeepFp32ForTests"}))
    assert forecast_load(folder, dtype="bf16").model_bytes == 256 * 4 + 256 * 2


def test_bad_input_is_named(crafted, tmp_path):
    with pytest.raises(DeviceError, match="device spec 'tpu' is not understood"):
        forecast_load(crafted, device="tpu")
    with pytest.raises(CheckpointError, match="no such file"):
        forecast_load(tmp_path / "nowhere")


def test_cli_forecast_json_prints_one_object_with_the_prediction(crafted, capsys):
    assert main(["forecast", str(crafted), "--mode", "retain", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted_peak_bytes"] == 36864 and out["predicted_footprint_ratio"] == 2.0 and out["mode"] == "retain"
    assert main(["forecast", str(crafted)]) == 0
    assert "predicted peak" in capsys.readouterr().out
    assert main(["forecast", str(crafted / "missing"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["ok"] is False


@pytest.fixture(scope="module")
def sharded_128mib(tmp_path_factory) -> Path:
    """128 MiB: 16 bf16 tensors of 8 MiB with an fp32 norm each, 4 shards of 4, never zeros."""
    folder = tmp_path_factory.mktemp("fc") / "transformer"
    folder.mkdir()
    base = torch.randn(2048, 2048, generator=torch.Generator().manual_seed(3)).add_(3).to(torch.bfloat16)
    for s in range(4):
        tensors = {}
        for i in range(4):
            k = 4 * s + i
            tensors[f"blocks.{k}.proj.weight"] = base * (1 + k / 32)
            tensors[f"blocks.{k}.norm.weight"] = torch.full((2048,), 1.0 + k)
        save_file(tensors, str(folder / f"model-{s + 1:05d}-of-00004.safetensors"))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("mode, dtype", [("stream", None), ("drain", None), ("retain", None), ("stream", "fp32")])
def test_the_forecast_is_within_5_percent_of_a_measured_load(sharded_128mib, mode, dtype):
    cmd = [sys.executable, "-m", "loader", "load", str(sharded_128mib), "--mode", mode, "--json"]
    result = subprocess.run(cmd + (["--dtype", dtype] if dtype else []), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout)
    predicted = forecast_load(sharded_128mib, mode=mode, dtype=dtype)
    assert predicted.bytes_placed == measured["bytes_placed"]
    assert abs(predicted.predicted_footprint_ratio / measured["footprint_ratio"] - 1) <= 0.05, (predicted, measured)

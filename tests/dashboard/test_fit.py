""""Will it fit?": the predicted peak against the pool, the memory limit, the budget and the floor."""

from __future__ import annotations

from dashboard.views import fit

GIB = 2**30
MIB = 2**20


def test_a_load_that_fits_the_pool_says_how_much_is_spare():
    walls = fit.walls(in_use=4 * GIB, capacity=24 * GIB)
    guess = fit.forecast("stream", fit.mode_peaks(2 * GIB), walls)
    assert guess.level == "ok"
    assert guess.message == "Fits: predicted peak 2.0 GiB, 18.0 GiB to spare under the 24.0 GiB pool (4.0 GiB in use now)."


def test_the_typed_memory_limit_is_the_wall_and_a_cheaper_mode_is_named():
    # Plenty of pool left, but a 3 GiB limit on a worker that holds 0.25 GiB before loading.
    walls = fit.walls(in_use=4 * GIB, capacity=120 * GIB, limit=3 * GIB, limit_baseline=GIB // 4)
    guess = fit.forecast("retain", fit.mode_peaks(int(1.5 * GIB)), walls)
    assert guess.level == "over" and guess.wall.name == "limit"
    assert guess.message.startswith("Will not fit under the 3.0 GiB memory limit: predicted peak 3.0 GiB, 2.8 GiB allowed.")
    assert guess.message.endswith("stream (1.5 GiB) fits, with 1.2 GiB to spare.")


def test_when_no_mode_fits_the_message_says_by_how_much_to_raise_the_limit():
    walls = fit.walls(in_use=0, capacity=120 * GIB, limit=GIB)
    guess = fit.forecast("stream", fit.mode_peaks(int(2.9 * GIB)), walls)
    assert "Will not fit under the 1.0 GiB memory limit: predicted peak 2.9 GiB" in guess.message
    assert "No mode fits: the cheapest, stream, needs 2.9 GiB; raise the limit by 1.9 GiB" in guess.message


def test_budget_and_floor_are_walls_too_and_the_tightest_wins():
    walls = fit.walls(in_use=100 * GIB, capacity=121 * GIB, budget=30 * GIB, floor=16 * GIB)
    guess = fit.forecast("drain", fit.mode_peaks(4 * GIB), walls)
    assert guess.wall.name == "floor" and guess.wall.allowance == 5 * GIB
    assert guess.level == "tight"  # 4.64 GiB of the 5 GiB the floor leaves
    assert "the 16.0 GiB MemAvailable floor" in guess.message


def test_small_limits_read_in_mib_never_as_zero_gib():
    walls = fit.walls(in_use=GIB, capacity=24 * GIB, budget=400 * MIB)
    guess = fit.forecast("stream", fit.mode_peaks(500 * MIB), walls)
    assert guess.message.startswith("Will not fit under the 400 MiB memory budget: predicted peak 500 MiB")


def test_a_load_forecast_comes_from_the_loaders_own_prediction_per_mode(tiny_checkpoint, data_dir):
    from machine.device import DeviceInfo
    from loader.forecast import forecast_load

    cpu = DeviceInfo(spec="cpu", kind="cpu", index=None, name="cpu", unified_memory=False, total_memory=None,
                     source="test", reason="test")
    peaks = fit.load_peaks(str(tiny_checkpoint), component=None, dtype="float16", device=cpu, roots=[data_dir / "models"])
    assert peaks == {m: forecast_load(tiny_checkpoint, mode=m, dtype="float16", device_info=cpu).predicted_peak_bytes
                     for m in ("retain", "drain", "stream")}
    # Not the fixed per-mode ratios: at this size stream's staging outweighs retain's second copy.
    assert peaks != fit.mode_peaks(tiny_checkpoint.stat().st_size // 2)


def test_a_load_forecast_of_a_checkpoint_the_loader_refuses_is_none(tmp_path):
    from machine.device import DeviceInfo

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00")
    cpu = DeviceInfo(spec="cpu", kind="cpu", index=None, name="cpu", unified_memory=False, total_memory=None,
                     source="test", reason="test")
    assert fit.load_peaks(str(bad), component=None, dtype=None, device=cpu, roots=[tmp_path]) is None

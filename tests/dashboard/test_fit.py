""""Will it fit?": the submit check's need against its tightest wall, in the page's words."""

from __future__ import annotations

from dashboard.views import fit

GIB = 2**30
MIB = 2**20


def _found(peak: int, allowance: int, *, need: int | None = None, wall: str = "budget", startup: int | None = 0,
           label: str = "the 1.00 GiB budget") -> dict:
    """An Admission dict as jobs.admission.assess makes it, reduced to what the fit panel reads."""
    return {"tightest": {"stage": "decode.video", "wall": wall, "peak": peak, "allowance": allowance,
                         "label": label, "floor": 0}, "need": need or peak, "startup": startup}


def test_a_job_that_fits_says_its_need_and_what_is_spare():
    shown = fit.submit_fit(_found(300 * MIB, GIB), in_use=4 * GIB)
    assert shown.forecast.level == "ok" and shown.base == 4 * GIB and shown.caption == "budget 1.0 GiB"
    assert shown.forecast.message == "Fits: needs 300 MiB, 724 MiB to spare under the 1.00 GiB budget."


def test_a_refused_job_says_its_whole_need_once_in_the_pages_words():
    shown = fit.submit_fit(_found(700 * MIB, 230 * MIB, need=690 * MIB, label="the 230.0 MiB budget"), in_use=0)
    assert shown.forecast.level == "over"
    assert shown.forecast.message == ("Will not fit: needs 690 MiB, over the 230.0 MiB budget: set the budget to "
                                      "at least that, or tick *Queue anyway*.")


def test_without_history_of_the_process_it_never_says_fits():
    shown = fit.submit_fit(_found(100 * MIB, GIB, startup=None), in_use=0)
    assert shown.forecast.level == "tight" and not shown.forecast.message.startswith("Fits:")
    assert "no history of a job's own process yet" in shown.forecast.message


def test_a_refused_load_names_a_cheaper_mode_whose_need_fits():
    peaks = {"retain": 2 * GIB, "drain": int(1.16 * GIB), "stream": GIB}
    assert fit.cheaper_mode("retain", peaks, 2 * GIB + 200 * MIB, int(1.5 * GIB)) == \
        "The stream mode needs 1.2 GiB and fits."
    assert fit.cheaper_mode("stream", peaks, GIB + 200 * MIB, GIB) is None


def test_a_load_forecast_comes_from_the_loaders_own_prediction_per_mode(tiny_checkpoint, data_dir):
    from machine.device import DeviceInfo
    from loader.forecast import forecast_load

    cpu = DeviceInfo(spec="cpu", kind="cpu", index=None, name="cpu", unified_memory=False, total_memory=None,
                     source="test", reason="test")
    peaks = fit.load_peaks(str(tiny_checkpoint), component=None, dtype="float16", device=cpu, roots=[data_dir / "models"])
    assert peaks == {m: forecast_load(tiny_checkpoint, mode=m, dtype="float16", device_info=cpu).predicted_peak_bytes
                     for m in ("retain", "drain", "stream")}
    # At this size stream's staging outweighs retain's second copy: no fixed per-mode ratio says that.
    assert peaks["stream"] > peaks["retain"]


def test_a_load_forecast_of_a_checkpoint_the_loader_refuses_is_none(tmp_path):
    from machine.device import DeviceInfo

    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00")
    cpu = DeviceInfo(spec="cpu", kind="cpu", index=None, name="cpu", unified_memory=False, total_memory=None,
                     source="test", reason="test")
    assert fit.load_peaks(str(bad), component=None, dtype=None, device=cpu, roots=[tmp_path]) is None

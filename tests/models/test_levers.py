"""The speed levers on `tiny`: each accepted or refused for the device in one line, applied through diffusers' public
API, a lossy one changing the frames, a compiled DiT's first call timed apart, the job record carrying them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffusers import AutoencoderKLMiniMaxH3, MiniMaxH3Transformer3DModel
from machine.device import DeviceInfo
from models.cli import main
from models.speed.levers import (COMPILE_CALLS, COMPILE_STAGE, LEVER_OPTIONS, VAE_COMPILE_STAGE, attention_problem,
                           is_lossless, key_part, lever_key, lever_option, lever_problems)
from models.request.params import GenerateParams, GenerateParamsError, ModelSpec, validate_params
from models.quantization.check import FP8_COMPUTE
from models.run.pipeline import run_generate
from models.speed.speedups import CACHE_REUSE_COUNTS, COMPILE_BACKEND_ENV

UNIFIED = DeviceInfo(spec="cpu", kind="cpu", index=None, name="fake unified GPU", unified_memory=True,
                     total_memory=8 * 2**30, source="test", reason="a unified device for tests")
SMALL = GenerateParams(prompt="a red fox in the snow", frames=124, height=64, width=64, steps=6, seed=7, audio=False)


@pytest.mark.parametrize("backend, refused", [
    ("native", None), ("_native_flash", None),
    ("_native_cudnn", "cuDNN attention runs on CUDA only, not on cpu"),
    ("_native_efficient", "memory-efficient attention runs on CUDA only, not on cpu"),
    ("sage", "needs the sageattention package, which is not installed here"),
])
def test_on_a_cpu_only_the_native_backends_are_accepted(backend: str, refused: str | None):
    problem = attention_problem(backend, "cpu", None)
    assert problem is None if refused is None else (refused in problem and "\n" not in problem)


def test_on_cuda_a_backend_needs_its_compute_capability_and_diffusers_requirement_check_runs():
    assert attention_problem("_native_cudnn", "cuda:0", (9, 0)) is None  # an H200
    assert "needs CUDA compute capability 8.0 or newer; cuda:0 has 7.5" in attention_problem(
        "_native_flash", "cuda:0", (7, 5))


def test_fp8_compute_is_refused_off_cuda_8_9_and_accepted_on_an_h200(monkeypatch: pytest.MonkeyPatch):
    import models.quantization.check as check

    monkeypatch.setattr(check, "torchao_installed", lambda: True)
    assert lever_problems({"quantize": FP8_COMPUTE}, "cpu", None) == {
        "quantize": "fp8-compute needs a CUDA GPU of compute capability 8.9 or newer; cpu has no CUDA (int8 runs on"
                    " CPU and CUDA)"}
    assert lever_problems({"quantize": FP8_COMPUTE}, "cuda:0", (9, 0)) == {}


def test_a_step_cache_h3_cannot_take_is_refused_in_one_line_and_taylorseer_is_accepted(h3_tiny: Path):
    model = ModelSpec.read(h3_tiny)
    for cache in ("first-block", "mag"):
        with pytest.raises(GenerateParamsError) as caught:
            validate_params(GenerateParams(prompt="x", step_cache=cache), model)
        assert caught.value.problems == {"step_cache": (
            f"the {cache} cache is unavailable for MiniMax H3: it needs MiniMaxH3TransformerBlock in diffusers'"
            " transformer-block registry, which diffusers 0.42 does not fill and offers no public API to fill")}
    validate_params(GenerateParams(prompt="x", step_cache="taylorseer"), model)


def test_each_lever_setting_is_labelled_once_and_a_set_is_lossless_only_when_each_is():
    assert len({(o.field, o.value) for o in LEVER_OPTIONS}) == len(LEVER_OPTIONS)
    assert lever_option("attention", "native") is None and lever_option("compile", False) is None
    assert is_lossless({"attention": "_native_cudnn", "compile": True})
    assert not is_lossless({"attention": "_native_cudnn", "step_cache": "taylorseer"})
    assert not is_lossless({"attention": "sage"})
    assert lever_key({"attention": "native", "compile": False}) == ""
    assert lever_key({"step_cache": "taylorseer", "compile": True, "attention": "_native_flash"}) == (
        "attention=_native_flash+compile+step_cache=taylorseer")


def test_a_cpu_generate_refuses_a_cuda_only_backend_in_one_line_before_reading_a_weight(
        capsys, h3_tiny: Path, tmp_path: Path):
    code = main(["generate", str(h3_tiny), "--prompt", "fox", "--out", str(tmp_path / "c.mp4"), "--attention",
                 "_native_cudnn", "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 2 and body["errors"] == [
        "attention: _native_cudnn: cuDNN attention runs on CUDA only, not on cpu; on cpu use native or _native_flash"]
    assert not (tmp_path / "c.mp4").exists()


@pytest.mark.parametrize("command", ["generate", "forecast"])
def test_plan_fastest_refuses_a_backend_the_device_cannot_run_instead_of_planning_another(
        command: str, capsys, h3_tiny: Path, tmp_path: Path):
    out = ["--out", str(tmp_path / "c.mp4")] if command == "generate" else []
    code = main([command, str(h3_tiny), *out, "--prompt", "fox", "--height", "64", "--width", "64", "--attention",
                 "_native_cudnn", "--plan", "fastest", "--json"])
    captured = capsys.readouterr()
    assert code == 2 and json.loads(captured.out)["errors"] == [
        "attention: _native_cudnn: cuDNN attention runs on CUDA only, not on cpu; on cpu use native or _native_flash"]
    assert "plan:" not in captured.err and not (tmp_path / "c.mp4").exists()


def test_taylorseer_changes_the_frames_records_its_lever_set_and_holds_the_buffers_the_forecast_counts(
        h3_tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from diffusers.hooks import HookRegistry

    from machine.offload import OffloadSettings
    from models.run import state as run_state
    from models.forecast import forecast_generate

    exact = run_generate(h3_tiny, SMALL, tmp_path / "exact.mp4", device_info=UNIFIED)
    events, dits, computed = [], [], []
    original = run_state.apply_levers

    def apply(module, **kw):
        dits.append(module)
        applied = original(module, **kw)
        # What ran, seen through torch's own hooks: each block's attention runs its projections only when the cache
        # computes it (the cache's hook replaces the attention's forward when it predicts).
        for block in module.transformer_blocks:
            block.attn.to_q.register_forward_hook(lambda *_: computed.append(1))
        return applied
    monkeypatch.setattr(run_state, "apply_levers", apply)
    params = GenerateParams(**{**SMALL.to_dict(), "step_cache": "taylorseer"})
    cached = run_generate(h3_tiny, params, tmp_path / "cached.mp4", device_info=UNIFIED, on_event=events.append)
    # What the hooks hold once the loop is done (their state, read here only to check the forecast's count).
    held = sum(factor.nbytes for module in dits[0].modules()
               for hook in [HookRegistry.check_if_exists_or_initialize(module).get_hook("taylorseer_cache")] if hook
               for state in hook.state_manager._state_cache.values()
               for factors in state.taylor_factors.values() for factor in factors.values())
    forecast = forecast_generate(h3_tiny, params, device_info=UNIFIED, settings=OffloadSettings())
    assert held == forecast.lever_bytes["step_cache"] > 0
    # 5 DiT calls: TaylorSeer computes the first three, predicts the fourth and computes the fifth (its refresh), so
    # the frames move; the counts recorded are the calls the attention ran on.
    blocks = len(dits[0].transformer_blocks)
    assert len(computed) == blocks * cached.steps_computed
    assert (cached.steps, cached.steps_computed, cached.steps_reused) == (5, 4, 1)
    assert (exact.steps, exact.steps_computed, exact.steps_reused) == (5, 5, 0)
    assert cached.video_sha256 != exact.video_sha256
    assert cached.levers == {"attention": "native", "compile": False, "quantize": None, "step_cache": "taylorseer",
                             "vae_compile": False, "key": "step_cache=taylorseer", "lossless": False}
    assert exact.levers["key"] == "" and exact.levers["lossless"]
    assert CACHE_REUSE_COUNTS in cached.notes
    assert [e.message for e in events if e.kind == "lever"] == ["transformer: step cache taylorseer"]


def test_a_compiled_dit_s_calls_that_compile_are_their_own_stage_and_the_backend_is_set_through_diffusers(
        h3_tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    compiled, backends = [], []
    # Compiling for real takes minutes on this CPU (bench/bench_levers.py does it on a GPU); the spies record that
    # diffusers' public entry points were called on the loaded DiT.
    monkeypatch.setattr(MiniMaxH3Transformer3DModel, "compile_repeated_blocks", lambda self: compiled.append(self))
    original = MiniMaxH3Transformer3DModel.set_attention_backend
    monkeypatch.setattr(MiniMaxH3Transformer3DModel, "set_attention_backend",
                        lambda self, name: (backends.append(name), original(self, name)))
    params = GenerateParams(**{**SMALL.to_dict(), "steps": 4, "compile": True, "attention": "_native_flash"})
    events = []
    result = run_generate(h3_tiny, params, tmp_path / "c.mp4", device_info=UNIFIED, on_event=events.append)
    assert len(compiled) == 1 and backends == ["_native_flash"]
    assert result.stages.index(COMPILE_STAGE) == result.stages.index("denoise.denoise") + 1
    assert result.stages.count("denoise.denoise") == 1 + COMPILE_CALLS and result.stage_seconds[COMPILE_STAGE] > 0
    steps = [(e.stage, e.data["step"]) for e in events if e.kind == "step"]
    assert steps == [("denoise.denoise", 1), ("denoise.denoise", 2), ("denoise.denoise", 3)]
    marks = [(e.kind, e.stage) for e in events if e.kind in ("stage_start", "stage_end")
             and e.stage in ("denoise.denoise", COMPILE_STAGE)]
    assert marks == [(k, s) for s in ("denoise.denoise", *[COMPILE_STAGE, "denoise.denoise"] * COMPILE_CALLS)
                     for k in ("stage_start", "stage_end")]
    assert result.levers["key"] == "attention=_native_flash+compile" and result.levers["lossless"]


def test_the_forecast_counts_a_cache_while_the_dit_is_resident_and_names_what_only_a_gpu_can_fit(h3_tiny: Path):
    from machine.offload import OffloadSettings
    from models.forecast.eta import stage_work
    from models.forecast import forecast_generate

    def forecast(sequential: bool, **levers):
        return forecast_generate(h3_tiny, GenerateParams(**{**SMALL.to_dict(), **levers}), device_info=UNIFIED,
                                 settings=OffloadSettings(), sequential_components=sequential)

    for sequential, holding in ((True, {"denoise.denoise"}), (False, {"denoise.denoise", "decode.video"})):
        plain, cached = forecast(sequential), forecast(sequential, step_cache="taylorseer")
        grown = {s.stage for s, p in zip(cached.stages, plain.stages) if s.total_bytes != p.total_bytes}
        assert grown == holding
        assert all(s.total_bytes - p.total_bytes == cached.lever_bytes["step_cache"]
                   for s, p in zip(cached.stages, plain.stages) if s.stage in grown)
    compiled = forecast(True, compile=True)
    assert compiled.not_counted == ["compile: the compiled blocks' workspace and the compiler's own memory are not "
                                    "counted; only a GPU run can fit them (bench/bench_levers.py)"]
    work, plain_work = stage_work(compiled), stage_work(forecast(True))
    assert work[COMPILE_STAGE] == 1.0 and COMPILE_STAGE not in plain_work
    assert work["denoise.denoise"] * 5 == plain_work["denoise.denoise"] * 3  # 6 steps: 5 calls, the 2 compiling apart


def test_both_compiles_are_lossless_and_refused_on_cuda_without_triton_in_one_line(monkeypatch: pytest.MonkeyPatch):
    import models.speed.levers as levers

    assert lever_option("vae_compile", True).lossless and lever_option("vae_compile", False) is None
    assert lever_key({"compile": True, "vae_compile": True}) == "compile+vae_compile"
    assert key_part("attention=_native_flash+compile+vae_compile", ("vae_compile",)) == "vae_compile"
    assert key_part("attention=_native_flash+compile+vae_compile", levers.DIT_LEVERS) == (
        "attention=_native_flash+compile")
    both = {"compile": True, "vae_compile": True}
    monkeypatch.setattr(levers, "triton_installed", lambda: False)
    problems = lever_problems(both, "cuda:0", (9, 0))
    assert problems == dict.fromkeys(both, "compile on cuda:0 needs the triton package (torch.compile's inductor), "
                                           "which is not installed here")
    assert lever_problems(both, "cpu", None) == {}
    monkeypatch.setattr(levers, "triton_installed", lambda: True)
    assert lever_problems(both, "cuda:0", (9, 0)) == {}


def test_vae_compile_is_a_flag_of_generate_and_a_bool_of_the_spec(h3_tiny: Path):
    import argparse

    from models.request.cli_args import add_workflow_arguments, workflow_fields

    parser = argparse.ArgumentParser()
    add_workflow_arguments(parser)
    assert workflow_fields(parser.parse_args(["--vae-compile"])) == {"vae_compile": True}
    assert workflow_fields(parser.parse_args([])) == {}
    with pytest.raises(GenerateParamsError) as caught:
        validate_params(GenerateParams(prompt="x", vae_compile="yes"), ModelSpec.read(h3_tiny))
    assert caught.value.problems == {"vae_compile": "must be true or false, got 'yes'"}


def _decode_stages(result) -> list[str]:
    return [s for s in result.stages if s.startswith("decode.")]


def test_a_compiled_vae_decoder_s_first_call_is_its_own_stage_and_its_frames_are_the_exact_run_s(
        h3_tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # torch.compile's `eager` backend (the documented COMPILE_BACKEND_ENV): dynamo captures the decoder blocks' graphs
    # as inductor would be handed them and runs them without generating code, so this takes seconds. Inductor itself
    # took 76 s here from a cold cache (over a slow test's budget); its frames against the exact run are measured by
    # bench/bench_levers.py's vae-compile case (docs/models.md gives the tolerance).
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "eager")
    compiled = []
    original = AutoencoderKLMiniMaxH3.compile_repeated_blocks
    monkeypatch.setattr(AutoencoderKLMiniMaxH3, "compile_repeated_blocks",
                        lambda self, **kw: (compiled.append(kw), original(self, **kw))[1])
    exact = run_generate(h3_tiny, SMALL, tmp_path / "exact.mp4", device_info=UNIFIED)
    events = []
    params = GenerateParams(**{**SMALL.to_dict(), "vae_compile": True})
    result = run_generate(h3_tiny, params, tmp_path / "vae.mp4", device_info=UNIFIED, on_event=events.append)
    assert compiled == [{"backend": "eager"}]
    assert [e.message for e in events if e.kind == "lever"] == [
        "vae: compile of the decoder's repeated blocks (eager)"]
    assert _decode_stages(exact) == ["decode.video"]
    assert _decode_stages(result) == ["decode.video", VAE_COMPILE_STAGE, "decode.video"]
    assert result.stage_seconds[VAE_COMPILE_STAGE] > 0
    marks = [(e.kind, e.stage) for e in events
             if e.kind in ("stage_start", "stage_end") and e.stage.startswith("decode")]
    assert marks == [(k, s) for s in ("decode.video", VAE_COMPILE_STAGE, "decode.video")
                     for k in ("stage_start", "stage_end")]
    assert result.levers["vae_compile"] and result.levers["key"] == "vae_compile" and result.levers["lossless"]
    assert result.video_sha256 == exact.video_sha256  # the eager backend runs the same kernels


def test_the_forecast_and_the_eta_know_the_vae_compile_and_only_the_decode_learns_it(h3_tiny: Path):
    from machine.offload import OffloadSettings
    from models.forecast.eta import StageRecord, estimate, stage_work
    from models.forecast import forecast_generate

    forecast = forecast_generate(h3_tiny, GenerateParams(**{**SMALL.to_dict(), "vae_compile": True}),
                                 device_info=UNIFIED, settings=OffloadSettings(), sequential_components=True)
    assert forecast.not_counted == [
        "vae_compile: the compiled decoder blocks' workspace and the compiler's own memory are not counted; only a GPU"
        " run can fit them (bench/bench_levers.py, case vae-compile)"]
    work = stage_work(forecast)
    assert work[VAE_COMPILE_STAGE] == 1.0 and COMPILE_STAGE not in work
    # A past run with both compiles: its decode times only a run with the VAE compile, its steps only one with the
    # DiT's, whatever the other lever.
    past = [StageRecord(stage, 2.0, 1.0, "cpu:x", "compile+vae_compile")
            for stage in ("denoise.denoise", "decode.video", VAE_COMPILE_STAGE, "text_encoder")]
    units = {"denoise.denoise": 1.0, "decode.video": 1.0, VAE_COMPILE_STAGE: 1.0, "text_encoder": 1.0}

    def timed(key: str) -> set[str]:
        return {e.stage for e in estimate(units, past, "cpu:x", key) if e.seconds is not None}
    assert timed("vae_compile") == {"decode.video", VAE_COMPILE_STAGE, "text_encoder"}
    assert timed("compile") == {"denoise.denoise", "text_encoder"}
    assert timed("attention=_native_flash+vae_compile") == {"decode.video", VAE_COMPILE_STAGE, "text_encoder"}
    assert timed("") == {"text_encoder"}

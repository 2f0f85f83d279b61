"""Offload policy: every rule of resolve_offload, the flag list, and the explicit-argument guard."""

from __future__ import annotations

import dataclasses

import pytest

from machine.device import DeviceInfo
from machine.offload import (
    UNIFIED_MEMORY_OFFLOAD_FLAGS,
    OffloadDecision,
    OffloadSettings,
    resolve_offload,
)

ALL_OFF = {flag: False for flag in UNIFIED_MEMORY_OFFLOAD_FLAGS}


def make_device(kind="cuda", *, unified, name="NVIDIA GB10", source="cuda-driver") -> DeviceInfo:
    return DeviceInfo(
        spec=kind, kind=kind, index=0 if kind == "cuda" else None, name=name, unified_memory=unified,
        total_memory=128 * 2**30, source=source, reason="made up for a test",
    )


@pytest.fixture
def gb10():
    """A unified-memory CUDA device as the driver reports a DGX Spark."""
    return make_device(unified=True)


@pytest.fixture
def h200():
    """A discrete CUDA device."""
    return make_device(unified=False, name="NVIDIA H200")


@pytest.fixture
def apple_mps():
    return make_device("mps", unified=True, name="Apple MPS", source="mps")


def changed(decisions: list[OffloadDecision]) -> dict[str, tuple[bool, bool]]:
    return {d.flag: (d.before, d.after) for d in decisions}


def test_defaults_match_fastvideo():
    assert OffloadSettings().to_dict() == {
        "dit_layerwise_offload": True,
        "dit_cpu_offload": True,
        "text_encoder_cpu_offload": True,
        "image_encoder_cpu_offload": True,
        "vae_cpu_offload": True,
        "pin_cpu_memory": True,
    }


def test_a_stored_spec_with_the_retired_fsdp_flag_still_reads_back():
    stored = {**OffloadSettings(vae_cpu_offload=False).to_dict(), "use_fsdp_inference": True}
    assert OffloadSettings.from_dict(stored) == OffloadSettings(vae_cpu_offload=False)


def test_unified_memory_flags_are_exactly_the_settings_fields_ending_in_offload():
    offload_fields = {f.name for f in dataclasses.fields(OffloadSettings) if f.name.endswith("_offload")}
    assert set(UNIFIED_MEMORY_OFFLOAD_FLAGS) == offload_fields
    assert len(UNIFIED_MEMORY_OFFLOAD_FLAGS) == len(offload_fields) == 5


@pytest.mark.parametrize("flag", UNIFIED_MEMORY_OFFLOAD_FLAGS)
def test_unified_memory_turns_off_each_offload_flag_on_its_own(flag, gb10):
    settings = OffloadSettings(**{**ALL_OFF, flag: True})
    resolved, decisions = resolve_offload(settings, gb10)
    assert getattr(resolved, flag) is False
    assert decisions == [
        OffloadDecision(flag, True, False, "NVIDIA GB10 has unified memory: moving weights to host frees nothing")
    ]


def test_unified_memory_turns_off_all_five_and_keeps_pinning(gb10):
    resolved, decisions = resolve_offload(OffloadSettings(pin_cpu_memory=True), gb10)
    assert changed(decisions) == {flag: (True, False) for flag in UNIFIED_MEMORY_OFFLOAD_FLAGS}
    assert resolved == OffloadSettings(**ALL_OFF, pin_cpu_memory=True)


@pytest.mark.parametrize("pin", [True, False])
def test_pin_cpu_memory_is_never_touched(pin, gb10, h200, apple_mps):
    for device in (gb10, h200, apple_mps):
        resolved, decisions = resolve_offload(OffloadSettings(pin_cpu_memory=pin), device)
        assert resolved.pin_cpu_memory is pin
        assert "pin_cpu_memory" not in changed(decisions)


def test_flags_already_off_stay_off_and_produce_no_decision(gb10, apple_mps):
    settings = OffloadSettings(**ALL_OFF)
    for device in (gb10, apple_mps):
        assert resolve_offload(settings, device) == (settings, [])


def test_mps_turns_off_the_five_flags(apple_mps):
    resolved, decisions = resolve_offload(OffloadSettings(), apple_mps)
    assert resolved == OffloadSettings(**ALL_OFF, pin_cpu_memory=True)
    assert changed(decisions) == {flag: (True, False) for flag in UNIFIED_MEMORY_OFFLOAD_FLAGS}
    reasons = {d.flag: d.reason for d in decisions}
    assert reasons["vae_cpu_offload"] == "Apple MPS has unified memory: moving weights to host frees nothing"


def test_discrete_leaves_flags_alone_when_layerwise_is_off(h200):
    settings = OffloadSettings(dit_layerwise_offload=False)
    assert resolve_offload(settings, h200) == (settings, [])


def test_discrete_layerwise_wins_over_dit_cpu_offload(h200):
    resolved, decisions = resolve_offload(OffloadSettings(), h200)
    assert changed(decisions) == {"dit_cpu_offload": (True, False)}
    assert resolved == OffloadSettings(dit_cpu_offload=False)
    assert all("dit_layerwise_offload is on" in d.reason for d in decisions)


def test_a_cpu_target_drops_offload_and_says_host_memory_is_the_target():
    cpu = make_device("cpu", unified=True, name="Intel Xeon", source="cpu")
    resolved, decisions = resolve_offload(OffloadSettings(), cpu)
    assert resolved == OffloadSettings(**ALL_OFF)
    assert decisions[0].reason.startswith("the target is the CPU")


def test_a_forced_answer_names_the_override_in_the_reason():
    forced = make_device(unified=True, name="NVIDIA H200", source="env:DRAINBOARD_UNIFIED_MEMORY=1")
    _, decisions = resolve_offload(OffloadSettings(), forced)
    assert len(decisions) == 5
    assert decisions[0].reason == (
        "NVIDIA H200 is treated as unified memory (DRAINBOARD_UNIFIED_MEMORY=1): moving weights to host frees nothing"
    )


def test_decisions_come_in_settings_field_order_and_read_as_a_line(gb10):
    _, decisions = resolve_offload(OffloadSettings(), gb10)
    assert [d.flag for d in decisions] == list(UNIFIED_MEMORY_OFFLOAD_FLAGS)
    assert str(decisions[1]) == (
        "dit_cpu_offload: on -> off (NVIDIA GB10 has unified memory: moving weights to host frees nothing)"
    )


def test_resolve_offload_does_not_mutate_its_input(gb10):
    settings = OffloadSettings()
    resolve_offload(settings, gb10)
    assert settings == OffloadSettings()


GIB = 2**30
REAL_SIZES = {"transformer": int(61.7 * GIB), "text_encoder": int(47.8 * GIB), "vae": 8 * GIB, "audio_vae": 2 * GIB}
"""The release's component sizes at bf16 (the text encoder as t2va reads it)."""


def _fit(sizes, *, working=GIB, capacity=int(139.8 * GIB), sequential=False):
    from machine.offload import ComponentFit

    return ComponentFit(dict(sizes), working, capacity, sequential)


def test_fit_aware_policy_keeps_every_component_resident_when_the_forecast_fits(h200):
    small = {name: 30 * 2**20 for name in REAL_SIZES}
    settings, decisions = resolve_offload(OffloadSettings(), h200, fit=_fit(small, capacity=128 * GIB))
    assert settings.to_dict() == {**ALL_OFF, "pin_cpu_memory": True}
    reasons = {d.flag: d.reason for d in decisions}
    assert reasons["text_encoder_cpu_offload"] == "text_encoder resident: predicted 1.1 of 128.0 GiB"
    assert reasons["dit_layerwise_offload"].startswith("transformer resident")


def test_fit_aware_policy_offloads_only_the_largest_component_that_must_leave(h200):
    settings, decisions = resolve_offload(OffloadSettings(), h200, fit=_fit(REAL_SIZES, working=25 * GIB))
    assert settings.dit_layerwise_offload and not settings.dit_cpu_offload
    assert not settings.text_encoder_cpu_offload and not settings.vae_cpu_offload
    reasons = {d.flag: d.reason for d in decisions}
    assert reasons["dit_layerwise_offload"] == "transformer offloaded: with it resident the predicted peak is 144.5 of 139.8 GiB"
    assert reasons["text_encoder_cpu_offload"] == "text_encoder resident: predicted 82.8 of 139.8 GiB"


def test_fit_aware_policy_offloads_further_components_until_the_forecast_fits(h200):
    # Without the DiT 82.8 GiB; an offloaded text encoder still comes in whole while it runs, so the VAEs go too.
    settings, _ = resolve_offload(OffloadSettings(), h200, fit=_fit(REAL_SIZES, working=25 * GIB, capacity=80 * GIB))
    assert settings.dit_layerwise_offload and settings.text_encoder_cpu_offload and settings.vae_cpu_offload
    settings, _ = resolve_offload(OffloadSettings(), h200, fit=_fit(REAL_SIZES, working=25 * GIB, capacity=83 * GIB))
    assert settings.dit_layerwise_offload and not settings.text_encoder_cpu_offload and not settings.vae_cpu_offload


def test_sequential_residency_fits_what_all_resident_does_not(h200):
    settings, _ = resolve_offload(OffloadSettings(), h200, fit=_fit(REAL_SIZES, working=20 * GIB, sequential=True))
    assert settings.to_dict() == {**ALL_OFF, "pin_cpu_memory": True}


def test_flags_the_user_set_win_over_the_fit(h200):
    small = {name: 2**20 for name in REAL_SIZES}
    settings, decisions = resolve_offload(OffloadSettings(), h200, fit=_fit(small),
                                          user_set={"text_encoder_cpu_offload"})
    assert settings.text_encoder_cpu_offload and not settings.dit_layerwise_offload
    assert "text_encoder_cpu_offload" not in {d.flag for d in decisions}


def test_on_unified_memory_the_fit_changes_nothing(gb10):
    with_fit = resolve_offload(OffloadSettings(), gb10, fit=_fit(REAL_SIZES))
    assert with_fit == resolve_offload(OffloadSettings(), gb10)

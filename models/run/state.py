"""One generate run's state: its stages (timed, sampled, announced) and where each weight component lives.

A stage is opened and closed explicitly (`begin` / `end`) because the blocks
that mark the pipeline's stages run apart, one before and one after each of
diffusers' blocks (`models.run.stage_blocks`); Drainboard's own stages around the
pipeline use `stage_of`. One stage is open at a time.
"""

from __future__ import annotations

import gc
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn as nn

from loader import release_cached_host_memory
from loader.api import synchronize
from machine.host_heap import give_back_free_heap
from machine.device import DeviceInfo
from machine.memory import MemoryProbe, MemorySample, PeriodicSampler
from machine.offload import OffloadSettings

from ..checkpoint.components import NotLoaded
from ..parallel.rank import enable_context_parallel
from ..quantization.quantize import DIT_COMPONENTS
from .residency import Placement, Residency, observe, pins_host_copy
from .results import EventSink, GenerateResult, PipelineEvent, SampleSink
from ..speed.levers import COMPILE_CALLS, COMPILE_STAGE, VAE_COMPILE_STAGE
from ..speed.speedups import apply_levers, compile_vae_decoder

PREPARE, ENCODE = "prepare", "encode"
"""Drainboard's own stages around the pipeline's blocks."""


def load_stage(component: str) -> str:
    """The stage in which `component` is loaded."""
    return f"load.{component}"


def lora_stage(component: str) -> str:
    """The stage before `component`'s load in which its LoRAs are prepared (each file hashed, its header converted):
    work of the LoRA, not of placing tensors. Their factors are read, converted and merged inside the load, a module
    at a time."""
    return f"lora.{component}"


class RunState:
    """One run's device, settings, reporting, and the components' residency."""

    def __init__(self, root: Path, pipe, device: torch.device, dtype: torch.dtype, mode: str,
                 settings: OffloadSettings, placements: dict[str, Placement], sequential: bool,
                 on_event: EventSink | None, on_sample: SampleSink | None, interval: float,
                 result: GenerateResult, probe: MemoryProbe):
        self.root, self.pipe, self.device, self.dtype, self.mode = root, pipe, device, dtype, mode
        self.settings, self.placements, self.sequential = settings, placements, sequential
        self.on_event, self.on_sample, self.interval = on_event, on_sample, interval
        self.result, self.probe = result, probe
        self.stage = PREPARE
        self.components = tuple(placements)
        self.vae_tiling = True
        self.vae_compile = False
        """Compile the video VAE's decoder blocks as it loads (`models.speed.speedups.compile_vae_decoder`)."""
        self.quantize: str | None = None
        self.single_files: dict[str, tuple[str, str]] = {}
        """Component -> (single file in the reference layout, its qkv layout) that supplies its weights."""
        self.levers: dict[str, Any] = {"attention": "native", "step_cache": None, "compile": False}
        """The DiT's speed levers (`models.speed.speedups.apply_levers`' arguments)."""
        self.dtypes: dict[str, torch.dtype] = {}
        self.resident: dict[str, Residency] = {}
        self.shells: dict[str, nn.Module] = {}
        self.roots: list[Path] | None = None
        self.device_info: DeviceInfo | None = None
        """The run device's probe (the job's, or run_generate's own): each load on that device reuses it."""
        self.group = None
        """This process's `models.parallel.rank.RankGroup` in a parallel run; None: a run of one process."""
        self.loras: tuple = ()
        """The run's LoRAs (`models.lora.inputs.LoraInput`, partition set), merged into their DiT as it loads."""
        self._sampler: PeriodicSampler | None = None
        self._started = 0.0

    def emit(self, kind: str, message: str, **data: Any) -> None:
        if self.on_event is not None:
            self.on_event(PipelineEvent(kind, self.stage, message, data))

    def record(self, sample: MemorySample) -> None:
        peak = sample.vm_rss + sample.device_allocated
        if peak > self.result.stage_peaks.get(self.stage, 0):
            self.result.stage_peaks[self.stage] = peak
        if self.on_sample is not None:
            self.on_sample(self.stage, sample)

    def begin(self, name: str) -> None:
        """Open stage `name`: announce it, sample now and every `interval` until `end`."""
        if self._sampler is not None:
            raise RuntimeError(f"stage {name!r} begun while stage {self.stage!r} is still open")
        self.stage = name
        self.result.stages.append(name)
        self.emit("stage_start", f"{name} started")
        self._started = time.monotonic()
        self.record(self.probe.sample())
        self._sampler = PeriodicSampler(self.probe, self.interval, self.record).start()

    def end(self) -> None:
        """Close the open stage once the device has finished its work; add its seconds (a reload adds up)."""
        self.abandon()
        synchronize(self.device)
        self.record(self.probe.sample())
        name, seconds = self.stage, time.monotonic() - self._started
        self.result.stage_seconds[name] = self.result.stage_seconds.get(name, 0.0) + seconds
        self.emit("stage_end", f"{name} done in {seconds:.2f} s", seconds=seconds,
                  peak_bytes=self.result.stage_peaks.get(name, 0))

    @contextmanager
    def interlude(self, name: str) -> Iterator[None]:
        """A stage `name` cut out of the open one (a compiled DiT's compiling call out of the denoise loop): the open
        stage ends, `name` runs, the open stage goes on (its seconds add up)."""
        outer = self.stage
        self.end()
        with self.stage_of(name):
            yield
        self.begin(outer)

    def first_calls_apart(self, module: nn.Module, name: str, calls: int) -> None:
        """Run each of `module`'s next `calls` calls as an `interlude` `name` (the calls that compile: a compiled
        DiT's first `COMPILE_CALLS`, a compiled VAE decoder's first), through torch's public forward hooks, removed
        after the last. A call that raises leaves the stage open for the run's `abandon`."""
        stack = ExitStack()

        def before(_module, _args) -> None:
            stack.enter_context(self.interlude(name))

        def after(_module, _args, _output) -> None:
            nonlocal calls
            stack.close()
            calls -= 1
            if not calls:
                opened.remove()
                closed.remove()
        opened = module.register_forward_pre_hook(before)
        closed = module.register_forward_hook(after)

    def abandon(self) -> None:
        """Stop the open stage's sampler without ending it (a block raised): no thread outlives the run."""
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    @contextmanager
    def stage_of(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        except BaseException:
            self.abandon()
            raise
        self.end()

    def load(self, name: str) -> None:
        """Fill `name` with the loader in its own stage, apply its placement, hand it to the pipeline."""
        placement = self.placements[name]
        adjust, merge = None, None
        if any(lora.partition == name for lora in self.loras):
            with self.stage_of(lora_stage(name)):
                adjust, merge = _lora_adjustments(self, name)
        with self.stage_of(load_stage(name)):
            module, report = _load_weights(self, name, torch.device(placement.load_device), adjust, merge)
            del adjust  # its closures held the factors; each weight's were dropped as it was merged
            if name == "vae" and not self.vae_tiling:
                module.disable_tiling()
            if name == "vae" and self.vae_compile:
                self.emit("lever", f"{name}: {compile_vae_decoder(module)}", component=name)
                self.first_calls_apart(module.decoder, VAE_COMPILE_STAGE, 1)
            if name in DIT_COMPONENTS:
                for line in apply_levers(module, **self.levers):
                    self.emit("lever", f"{name}: {line}", component=name)
                if self.levers["compile"]:
                    self.first_calls_apart(module, COMPILE_STAGE, COMPILE_CALLS)
                if self.group is not None:
                    self.emit("note", f"{name}: {enable_context_parallel(module, self.group)}", component=name)
            self.resident[name] = Residency(placement, module, self.device, self.settings)
            self.pipe.update_components(**{name: module})
            if self.sequential and self.device.type == "cuda":
                release_cached_host_memory()  # the load ring's page-locked buffers, not held while stages compute
        self.result.loads[name] = report
        skipped = report.get("excluded_bytes", 0)
        merged = report.get("lora", {}).get("loras", [])
        self.emit("load", f"loaded {name} on {placement.load_device} ({placement.mechanism})"
                  + (f"; {skipped / 2**20:.1f} MiB in {report.get('excluded_tensors', 0)} tensors not read"
                     f" ({self.result.workflow} never runs them)" if skipped else "")
                  + (f"; {len(merged)} LoRA(s) merged into {sum(m['targets'] for m in merged)} weights as they"
                     " were placed" if merged else ""),
                  component=name, device=placement.load_device, mechanism=placement.mechanism,
                  bytes=report.get("bytes_placed", 0), seconds=report.get("load_seconds", 0.0),
                  excluded_bytes=skipped, excluded_tensors=report.get("excluded_tensors", 0))

    def done_with(self, name: str) -> None:
        """After `name`'s last block: model offload goes back to the host; sequential residency releases it
        where it is (sending a 47.8 GiB text encoder back to the host only to drop it would cost the host
        its full size again, and seconds)."""
        residency = self.resident.get(name)
        if residency is None:
            return
        if not self.sequential:
            residency.offload()
            return
        nbytes = sum(p.nbytes for p in residency.module.parameters())
        del self.resident[name], residency
        stand_in = self.shells[name] if name in self.shells else NotLoaded(name, "released after its last block")
        self.pipe.update_components(**{name: stand_in})
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            release_cached_host_memory()  # a group-offloaded DiT's pinned blocks
        give_back_free_heap()  # its small tensors were heap chunks: without this they stay resident, or not
        self.emit("release", f"released {name} ({nbytes / 2**20:.1f} MiB)", component=name, bytes=nbytes)

    def observe(self, block: str) -> None:
        """Record, for `block`, where each weight component lives as our residency applied it."""
        where = {name: observe(self.resident.get(name)) for name in self.components}
        self.result.residency.append({"block": block, "components": where})


def _load_weights(run: RunState, name: str, target: torch.device, adjust=None, merge=None
                  ) -> tuple[nn.Module, dict[str, Any]]:
    """Load `name` onto `target`, merging `merge`'s LoRAs through `adjust` (`_lora_adjustments`) as it streams."""
    from ..checkpoint.components import load_component
    from ..quantization.quantize import held_bytes

    def on_tensor(placed) -> None:
        if placed.sample is not None:
            run.record(placed.sample)

    quantize = run.quantize if name in DIT_COMPONENTS else None
    single_file, qkv_layout = run.single_files.get(name, (None, "stacked"))
    info = run.device_info if run.device_info is not None and run.device_info.kind == target.type else None
    module, report = load_component(run.root, name, mode=run.mode, device=str(target), device_info=info,
                                    single_file=single_file,
                                    qkv_layout=qkv_layout,
                                    dtype=run.dtypes.get(name, run.dtype), workflow=run.result.workflow,
                                    on_tensor=on_tensor, probe=run.probe, roots=run.roots, quantize=quantize,
                                    pin_host=pins_host_copy(run.placements[name], run.device.type, run.settings,
                                                            quantized=quantize is not None), adjust=adjust)
    out = report.to_dict()
    if merge is not None:
        out["lora"] = merge.to_dict()
    if quantize is not None:
        out |= {"quantize": quantize, "bytes_held": held_bytes(module)}
    return module, out


def _lora_adjustments(run: RunState, name: str):
    """(the loader's adjust mapping, its LoraMerge) for the LoRAs merged into `name`, or (None, None)."""
    loras = [lora for lora in run.loras if lora.partition == name]
    if not loras:
        return None, None
    from loader.confined import read_json_checked

    from ..lora.merge import merge_adjustments

    config = read_json_checked(run.root / name / "config.json")
    return merge_adjustments(loras, name, config, run.roots if run.roots is not None else [run.root])

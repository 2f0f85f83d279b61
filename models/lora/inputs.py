"""A LoRA file as a generate input: `--lora FILE[:SCALE]`, what a job records of it, and its check at submit.

A LoRA is an input like an image: it must resolve under a model root, it is
size-bounded, and it is safetensors only (nothing is unpickled). It stays where
it is (a LoRA can be a gigabyte; it is not copied into the job's folder): the job
records its path, its content hash (checked again when the child reads it), its
scale and the DiT partition it is merged into.

The check reads the header alone. The layout is diffusers' to convert
(`MiniMaxH3LoraLoaderMixin.lora_state_dict`: diffusers/PEFT names, DiffSynth's
interleaved QKV, kohya / musubi-tuner, ai-toolkit): the conversion runs on
meta tensors built from the header, with only the per-module `.alpha` scalars
read, so names and shapes are known without reading the factors. Each converted
target must be a Linear weight of the partition's DiT with the shapes the factors
need; a file trained on another (pruned) checkpoint, one that targets no module
or one that holds no LoRA factors is refused in one line naming the file.

Routing is diffusers': `transformer_ref.` layers go to `transformer_ref`, which
only `ref2va` runs; `transformer.` layers go to the workflow's DiT (`ref2va`
holds `transformer_ref` alone, and diffusers routes them there).

Importing this module does not import torch (the CLI parsers and the Run page use it).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from core.echo import NAME_LIMIT, echo, echo_name
from core.errors import CheckpointError, DrainboardError

MAX_LORA_BYTES = 16 * 2**30
"""The largest LoRA file accepted: a rank-64 LoRA on every Linear of H3's DiT is a few GiB in fp32; past this a
file is no LoRA (or is a whole checkpoint)."""
MAX_LORAS = 8
"""LoRAs stacked on one job at most."""
MAX_SCALE = 10.0
"""|scale| at most: strengths in use are about 0..2 (negative subtracts a LoRA)."""
PARTITIONS = ("transformer", "transformer_ref")
"""The DiT partitions a MiniMax H3 LoRA is merged into."""
FACTOR_MARKERS = (".lora_A.", ".lora_B.", ".lora_down.", ".lora_up.", "lora_A.", "lora_B.")
"""Substrings that make a tensor name a LoRA factor in some layout (PEFT/diffusers, DiffSynth, kohya)."""
STEPS_KEYS = ("num_inference_steps", "steps")
"""`__metadata__` entries read as the steps a few-step LoRA was distilled for. No standard key exists; these are
the names Drainboard reads (never the file name)."""
SHIFT_KEYS = ("shift", "flow_shift")
"""`__metadata__` entries read as the sigma shift a few-step LoRA was distilled for (no standard key either)."""


class LoraError(DrainboardError):
    """A LoRA file that cannot be used: one line naming the file and what was found."""


@dataclass(frozen=True)
class LoraInput:
    """One LoRA of a generate request, as a job records it."""

    file: str
    """The safetensors file (resolved under a model root once checked)."""
    scale: float = 1.0
    """Strength: the merged delta is `scale * alpha / rank * (B @ A)`."""
    sha256: str | None = None
    """Content hash, set at submit; the child refuses a file that no longer has it."""
    partition: str | None = None
    """`transformer` or `transformer_ref`: the DiT it is merged into (set at submit, by diffusers' routing)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def name(self) -> str:
        return Path(self.file).name

    def label(self) -> str:
        """`name x scale`, for pages and logs (quoted: a file name is user input)."""
        return f"{echo(self.name)} x {self.scale:g}"


def parse_lora_arg(text: str) -> LoraInput:
    """`FILE[:SCALE]` -> LoraInput; the part after the last `:` is the scale when it is a number."""
    file, sep, tail = text.rpartition(":")
    if sep and file:
        try:
            return LoraInput(file=file, scale=check_scale(float(tail)))
        except ValueError as exc:
            if _is_number(tail):
                raise ValueError(f"--lora {echo(text)}: {exc}") from None
    return LoraInput(file=text)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_scale(scale: float) -> float:
    """`scale` when it is a finite number within +-MAX_SCALE, else ValueError."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {echo(scale)}")
    if abs(scale) > MAX_SCALE:
        raise ValueError(f"scale {scale:g} is outside -{MAX_SCALE:g}..{MAX_SCALE:g}")
    return float(scale)


def lora_from_value(value: Any) -> LoraInput:
    """A stored or submitted entry (a LoraInput, a `FILE[:SCALE]` string, or a mapping of LoraInput's fields)."""
    if isinstance(value, LoraInput):
        return value
    if isinstance(value, str):
        return parse_lora_arg(value)
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(LoraInput.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown LoRA field(s) {', '.join(echo(u) for u in unknown)}")
        if not isinstance(value.get("file"), str) or not value["file"]:
            raise ValueError(f"a LoRA needs a file path, got {echo(value.get('file'))}")
        scale = check_scale(value.get("scale", 1.0))
        return LoraInput(value["file"], scale, value.get("sha256"), value.get("partition"))
    raise ValueError(f"a LoRA is FILE[:SCALE] or an object with file and scale, got {echo(value)}")


@dataclass(frozen=True)
class LoraFacts:
    """What the header of one LoRA file says, checked against the partition's DiT."""

    lora: LoraInput
    """The input with its partition (and, when hashed, its sha256) set."""
    file_bytes: int
    """Size of the file."""
    factor_bytes: int
    """Bytes of the converted factors (read, converted and merged a group at a time while the partition loads)."""
    targets: int
    """Linear weights the file changes."""
    ranks: tuple[int, ...]
    """The distinct ranks of its factors."""
    held_bytes: int
    """The most its merge holds at once (`group_held_bytes` of its largest group)."""
    merge_bytes: int
    """What merging its largest target holds beside the group (`merge_held_bytes`)."""
    metadata: dict[str, str]
    """The header's `__metadata__`."""

    @property
    def stated_steps(self) -> int | None:
        """The steps the file's metadata says it was distilled for (`stated_steps`)."""
        return stated_steps(self.metadata)

    @property
    def stated_shift(self) -> float | None:
        """The shift the file's metadata says it was distilled for (`stated_shift`)."""
        return stated_shift(self.metadata)


def stated_steps(metadata: dict[str, str]) -> int | None:
    """The steps a LoRA's `__metadata__` says it was distilled for (an integer in 2..1000 under `STEPS_KEYS`), or
    None; never guessed from the file name."""
    for key in STEPS_KEYS:
        value = str(metadata.get(key, "")).strip()
        if value.isdigit() and 2 <= int(value) <= 1000:
            return int(value)
    return None


def stated_shift(metadata: dict[str, str]) -> float | None:
    """The sigma shift a LoRA's `__metadata__` says it was distilled for (a number in (0, 1000] under `SHIFT_KEYS`),
    or None."""
    for key in SHIFT_KEYS:
        try:
            value = float(str(metadata.get(key, "")).strip())
        except ValueError:
            continue
        if math.isfinite(value) and 0 < value <= 1000:
            return value
    return None


@dataclass(frozen=True)
class FoundLora:
    """A LoRA file found under the model roots (its header read, its factors not)."""

    path: str
    size: int
    stated_steps: int | None
    """The steps its metadata says it was distilled for (`stated_steps`)."""
    stated_shift: float | None = None
    """The shift its metadata says it was distilled for (`stated_shift`)."""


FIND_DEPTH = 4
"""Folders below a model root searched for LoRA files."""
FIND_LIMIT = 200
"""Safetensors headers read at most per search (a root of many checkpoints costs no more)."""


def find_lora_files(roots: Iterable[str | os.PathLike]) -> list[FoundLora]:
    """The `.safetensors` files under `roots` whose header holds LoRA factors, by path. Component folders of a
    checkpoint (a `config.json` beside the shards) are not searched; links are not followed."""
    from loader.roots import ModelRoots
    from loader.safetensors_file import read_shard_header

    found, read = [], 0
    for root in roots:
        top = Path(root)
        for folder, subfolders, files in os.walk(top, followlinks=False):
            depth = len(Path(folder).relative_to(top).parts)
            subfolders[:] = sorted(d for d in subfolders if depth < FIND_DEPTH and not d.startswith("."))
            if "config.json" in files or "model_index.json" in files or "modular_model_index.json" in files:
                continue
            for name in sorted(f for f in files if f.endswith(".safetensors")):
                if read >= FIND_LIMIT:
                    return found
                read += 1
                path = Path(folder) / name
                try:
                    shard, problems = read_shard_header(path, ModelRoots([top]))
                except CheckpointError:
                    continue
                if shard is None or problems or not any(m in t.name for t in shard.tensors for m in FACTOR_MARKERS):
                    continue
                found.append(FoundLora(str(path), shard.size, stated_steps(shard.metadata),
                                       stated_shift(shard.metadata)))
    return found


def few_step_warning(name: str, stated: int | None, steps: int) -> str | None:
    """What to say when a LoRA whose metadata states its steps is run at many more (twice or over); never guessed
    from the file name."""
    if stated is None or steps < 2 * stated:
        return None
    return (f"{echo(name)} says it was distilled for {stated} steps; {steps} steps run {steps - 1} transformer passes"
            f" where {stated - 1} would do (set Steps to {stated}, and the shift its card gives)")


MERGE_TRANSIENT_BYTES_PER_ELEMENT = 4 + 2
"""While one block of a weight is merged: its delta's float32 product, then that rounded to bf16
(`models.lora.merge.merge_delta`)."""
MERGE_SLICES = 16
"""`models.lora.merge.merge_delta` merges a weight in this many blocks of rows (fewer for a weight of fewer rows), so its
temporaries are 6 bytes for a sixteenth of the elements of the weight being merged (0.19x its bf16 bytes), never 6
bytes for each of them."""


def merge_rows(rows: int) -> int:
    """Rows of a weight merged at once: `rows / MERGE_SLICES`, rounded up."""
    return max(1, -(-rows // MERGE_SLICES))


def merge_held_bytes(shape: tuple[int, int], rank: int) -> int:
    """Bytes merging one `shape` weight at `rank` holds beside the weight and the group: A in float32, and for one
    block of rows B's rows in float32, their product and its rounding."""
    rows, cols = shape
    block = merge_rows(rows)
    return 4 * rank * (cols + block) + MERGE_TRANSIENT_BYTES_PER_ELEMENT * block * cols


def group_held_bytes(stored: int, converted: int) -> int:
    """Bytes reading one group holds at most: its tensors as stored, twice (the in-memory file diffusers reads and
    the tensors it reads them into), and their conversion (which shares the read tensors where the layout needs no
    change, and is counted apart as an upper bound)."""
    return 2 * stored + converted


def lora_load_bytes(root: str | os.PathLike, params) -> tuple[dict[str, int], dict[str, int]]:
    """Per partition: (bytes a run of `params` holds beyond the weights while it loads, bytes of LoRA factors its
    load reads, converts and merges). What is held is one group of each of its LoRAs (a weight's groups of stacked
    LoRAs are read together) and one merge's factors and temporaries; the work is every factor. Headers only; the
    files were checked under the model roots at submit."""
    groups: dict[str, int] = {}
    merging: dict[str, int] = {}
    work: dict[str, int] = {}
    for lora in params.loras:
        facts = inspect_lora(lora, root, params.resolved_workflow, [Path(lora.file).resolve().parent],
                             hash_file=False)
        partition = facts.lora.partition
        groups[partition] = groups.get(partition, 0) + facts.held_bytes
        merging[partition] = max(merging.get(partition, 0), facts.merge_bytes)
        work[partition] = work.get(partition, 0) + facts.factor_bytes
    return {p: n + merging[p] for p, n in groups.items()}, work


LORA_STAGES = ("load.transformer", "load.transformer_ref", "lora.transformer", "lora.transformer_ref")
"""Stages whose seconds a run's LoRAs change (their prep, and the loads that read, convert and merge them): the ETA
learns them per LoRA set (`lora_key`). The denoise is the same with or without a merged LoRA; its steps are in its
work (`models.forecast.eta.stage_work`)."""


def lora_key(values: dict[str, Any]) -> str:
    """The LoRA set as history keys it: each file's content hash (12 hex digits; its name where none was recorded),
    sorted, joined by `+`; "" for none. Scales and order change no time."""
    names = []
    for entry in values.get("loras") or ():
        lora = lora_from_value(entry)
        names.append(lora.sha256[:12] if lora.sha256 else lora.name)
    return "+".join(sorted(names))


def partition_for(workflow: str) -> str:
    """The DiT a workflow denoises with, where `transformer.` layers go (diffusers' routing)."""
    return "transformer_ref" if workflow == "ref2va" else "transformer"


def inspect_lora(lora: LoraInput, model_root: str | os.PathLike, workflow: str, roots: Iterable[str | os.PathLike],
                 *, hash_file: bool = True) -> LoraFacts:
    """Check one LoRA against the model at `model_root` for `workflow` (header only, plus the content hash when
    `hash_file`), or LoraError naming the file and what was found."""
    from loader.confined import open_checked
    from loader.roots import ModelRoots
    from loader.safetensors_file import read_shard_header
    from loader.validate import validate_shard

    path = Path(lora.file)
    shown = echo_name(path)
    if not path.name.endswith(".safetensors"):
        raise LoraError(f"LoRA {shown}: not a .safetensors file (only safetensors LoRAs are read; nothing is unpickled)")
    model_roots = ModelRoots(roots)
    try:
        fd, checked = open_checked(path, model_roots, f"LoRA {shown}")
    except CheckpointError as exc:
        raise LoraError(str(exc)) from None
    try:
        if checked.size > MAX_LORA_BYTES:
            raise LoraError(f"LoRA {shown}: {checked.size:,} bytes, more than the {MAX_LORA_BYTES:,} a LoRA may be")
        shard, problems = read_shard_header(checked.real, ModelRoots([checked.root]))
        problems = problems or validate_shard(shard)  # a truncated file's data ends before its header says
        if problems:
            raise LoraError(f"LoRA {shown}: not a readable safetensors file: {'; '.join(problems)[:300]}")
        digest = file_sha256(fd, remember=True) if hash_file else lora.sha256
    finally:
        os.close(fd)
    names = [t.name for t in shard.tensors]
    if not any(marker in n for n in names for marker in FACTOR_MARKERS):
        raise LoraError(f"LoRA {shown}: holds no LoRA factors (no lora_A/lora_B or lora_down/lora_up tensors);"
                        f" found {len(names)} tensors, e.g. {', '.join(echo(n, NAME_LIMIT) for n in names[:3]) or 'none'}")
    if any("dora_scale" in n or "lora_magnitude_vector" in n for n in names):
        raise LoraError(f"LoRA {shown}: a DoRA (magnitude vectors); only plain LoRAs are merged")
    groups = converted_on_meta(shard, shown)
    converted = {k: v for group in groups.values() for k, v in group.items()}
    partition = _route(converted, workflow, shown)
    factors = {k.split(".", 1)[1]: v for k, v in converted.items()}
    dit = _dit_shapes(Path(model_root), partition)
    targets, ranks = check_factors(factors, dit, shown, partition)
    stored = {m: sum(t.nbytes for t in tensors) for m, tensors in factor_groups(shard.tensors).items()}
    return LoraFacts(
        lora=LoraInput(str(checked.real), lora.scale, digest, partition), file_bytes=checked.size,
        factor_bytes=_nbytes(factors), targets=len(targets), ranks=tuple(sorted(set(ranks))),
        held_bytes=max(group_held_bytes(stored[m], _nbytes(group)) for m, group in groups.items()),
        merge_bytes=max(merge_held_bytes(dit[t], r) for t, r in zip(targets, ranks)),
        metadata=dict(shard.metadata),
    )


def _nbytes(tensors: dict) -> int:
    return sum(v.numel() * v.element_size() for v in tensors.values())


def file_sha256(fd: int, *, remember: bool = False) -> str:
    """SHA-256 of the whole file behind `fd`, read in `HASH_CHUNK` pieces. `remember`: reuse this process's hash of the
    same file (device, inode, size and mtime unchanged), so the Run page, which checks the spec on every rerun,
    reads a gigabyte LoRA once; the merge in the job's child always reads it afresh."""
    st = os.fstat(fd)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if remember and identity in _HASHES:
        return _HASHES[identity]
    digest, offset = hashlib.sha256(), 0
    while chunk := os.pread(fd, HASH_CHUNK, offset):
        digest.update(chunk)
        offset += len(chunk)
    if remember:
        _HASHES[identity] = digest.hexdigest()
    return digest.hexdigest()


HASH_CHUNK = 1 << 20
"""Bytes read at once to hash a LoRA: small beside any DiT (a 16 MiB piece once cost a demo DiT's load 0.3x its
bytes at its peak), large enough that hashing runs at the disk's speed."""
_HASHES: dict[tuple[int, int, int, int], str] = {}
"""(st_dev, st_ino, st_size, st_mtime_ns) -> sha256, for `file_sha256(remember=True)`."""


def factor_groups(tensors: Iterable) -> dict[str, list]:
    """A file's tensors (anything with a `.name`) grouped by the module they belong to: the name before its
    `.lora_*` suffix, or before `.alpha`. diffusers converts each group on its own (every layout it reads converts
    module by module: a fused QKV's group becomes three targets, its `.alpha` folds into its own factors), so a merge
    reads one group of the file at a time."""
    groups: dict[str, list] = {}
    for tensor in tensors:
        name = tensor.name
        module = name.split(".lora_", 1)[0] if ".lora_" in name else name.removesuffix(".alpha")
        groups.setdefault(module, []).append(tensor)
    return groups


def converted_on_meta(shard, shown: str) -> dict[str, dict]:
    """Group (`factor_groups`) -> diffusers' conversion of that group's names and shapes: factors on meta, `.alpha`
    scalars read. Converted group by group, as the merge converts them."""
    import torch
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    from loader.confined import read_at_most, reopen

    fd = reopen(shard.path, shard.checked)
    out = {}
    try:
        for module, tensors in factor_groups(shard.tensors).items():
            state = {}
            for meta in tensors:
                if meta.numel == 1 and meta.name.endswith(".alpha"):
                    raw = read_at_most(fd, meta.nbytes, meta.offset)
                    state[meta.name] = torch.frombuffer(bytearray(raw), dtype=meta.torch_dtype).reshape(meta.shape)
                else:
                    state[meta.name] = torch.empty(meta.shape, dtype=meta.torch_dtype, device="meta")
            try:
                out[module] = MiniMaxH3LoraLoaderMixin.lora_state_dict(state)
            except (ValueError, KeyError, RuntimeError, IndexError) as exc:
                raise LoraError(f"LoRA {shown}: not a MiniMax H3 LoRA layout diffusers reads: {echo_name(exc)}") from None
    except (KeyError, ValueError, RuntimeError) as exc:
        raise LoraError(f"LoRA {shown}: a tensor cannot be read: {echo_name(exc)}") from None
    finally:
        os.close(fd)
    return out


def _route(converted: dict, workflow: str, shown: str) -> str:
    """The partition the file's layers go to under `workflow` (diffusers' routing), or LoraError."""
    prefixes = {k.split(".", 1)[0] for k in converted}
    known = prefixes & set(PARTITIONS)
    if not known:
        raise LoraError(f"LoRA {shown}: targets no module: no layer names transformer or transformer_ref"
                        f" after diffusers' conversion (e.g. {', '.join(echo(k, NAME_LIMIT) for k in sorted(converted)[:3])})")
    if known == set(PARTITIONS):
        raise LoraError(f"LoRA {shown}: holds layers for both transformer and transformer_ref; give one file per partition")
    if known == {"transformer_ref"} and workflow != "ref2va":
        raise LoraError(f"LoRA {shown}: targets transformer_ref, which only ref2va runs ({workflow} denoises with"
                        " transformer)")
    return partition_for(workflow)


def _dit_shapes(root: Path, partition: str) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the partition's DiT, built on meta from its config (no weight read)."""
    from ..checkpoint.classes import build_empty, read_config

    folder = root / partition
    if not folder.is_dir():
        raise LoraError(f"the model at {echo_name(root)} has no {partition} to merge a LoRA into")
    module = build_empty(read_config(folder))
    return {n: tuple(p.shape) for n, p in module.named_parameters()}


def check_factors(factors: dict, dit: dict[str, tuple[int, ...]], shown: str,
                  partition: str) -> tuple[list[str], list[int]]:
    """(target weight names, ranks) of converted factors (`<module>.lora_A.weight` / `lora_B.weight` keys, no
    partition prefix) against the DiT's parameter shapes, or LoraError naming what does not fit."""
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in factors})
    extra = sorted(k for k in factors if not k.endswith((".lora_A.weight", ".lora_B.weight")))
    if extra:
        raise LoraError(f"LoRA {shown}: {len(extra)} tensor(s) are not LoRA factors diffusers merges (LoRA biases or"
                        f" other), e.g. {echo(extra[0], NAME_LIMIT)}")
    missing = [m for m in modules if f"{m}.weight" not in dit or len(dit[f"{m}.weight"]) != 2]
    if missing:
        raise LoraError(f"LoRA {shown}: {len(missing)} of its {len(modules)} modules are not Linear layers of"
                        f" {partition}, e.g. {echo(missing[0], NAME_LIMIT)}: it targets another model")
    ranks = []
    for m in modules:
        a, b = factors.get(f"{m}.lora_A.weight"), factors.get(f"{m}.lora_B.weight")
        out_features, in_features = dit[f"{m}.weight"]
        if a is None or b is None:
            raise LoraError(f"LoRA {shown}: {echo(m, NAME_LIMIT)} has only one of lora_A / lora_B")
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or tuple(a.shape)[1] != in_features \
                or tuple(b.shape)[0] != out_features:
            raise LoraError(
                f"LoRA {shown}: {echo(m, NAME_LIMIT)} has factors A {list(a.shape)} and B {list(b.shape)} but {partition}'s"
                f" weight is {[out_features, in_features]}: trained on another checkpoint (a pruned one?)")
        ranks.append(int(a.shape[0]))
    return [f"{m}.weight" for m in modules], ranks

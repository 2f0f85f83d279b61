"""Checkpoint validation from headers only: every problem, before any tensor byte is read.

Pure checks of what discovery described (`metadata`); `checkpoint.checkpoint_problems` runs both."""

from __future__ import annotations

from .dtypes import SAFETENSORS_DTYPES, itemsize
from core.echo import NAME_LIMIT, echo, echo_name
from .metadata import CheckpointIndex, ComponentMeta, ShardMeta


def validate_checkpoint(index: CheckpointIndex) -> list[str]:
    """Problems of every component, sorted; an empty list means the checkpoint is sound."""
    problems: list[str] = []
    for component in index.components.values():
        problems.extend(validate_component(component))
    return sorted(problems)


def validate_component(component: ComponentMeta) -> list[str]:
    """Header problems, per-shard data checks, duplicates across shards, index agreement."""
    problems = list(component.problems)
    owner: dict[str, str] = {}
    for shard in component.shards:
        problems.extend(validate_shard(shard))
        for t in shard.tensors:
            if t.name in owner:
                problems.append(f"tensor {echo(t.name, NAME_LIMIT)} appears in both {owner[t.name]} and "
                                f"{echo_name(shard.path.name)}")
            else:
                owner[t.name] = echo_name(shard.path.name)
    if component.weight_map is not None and component.index_file is not None:
        index_name = echo_name(component.index_file.name)
        read_files = {s.path.name for s in component.shards}
        for name, file in sorted(component.weight_map.items()):
            if file in read_files and owner.get(name) != echo_name(file):
                actual = f"is in {owner[name]}" if name in owner else "is in no shard header"
                problems.append(f"{index_name} maps {echo(name, NAME_LIMIT)} to {echo_name(file)}, but the tensor {actual}")
        for name, file in sorted(owner.items()):
            if name not in component.weight_map:
                problems.append(f"{file} holds {echo(name, NAME_LIMIT)}, which {index_name} does not list")
    return problems


def validate_shard(shard: ShardMeta) -> list[str]:
    """One shard's data checks: known dtypes, each tensor's bytes agreeing with its shape, its data inside the file,
    and the tensors tiling the data area (a lone file, such as a LoRA, is checked with this alone)."""
    problems = []
    file = echo_name(shard.path.name)
    data_size = shard.size - shard.data_start
    spans = []
    truncated = False
    for t in shard.tensors:
        begin, end = t.data_offsets
        found = []
        if t.dtype not in SAFETENSORS_DTYPES:
            found.append(f"has unknown dtype {echo(t.dtype, NAME_LIMIT)}; known: {', '.join(sorted(SAFETENSORS_DTYPES))}")
        elif t.numel * itemsize(t.dtype) != end - begin:
            found.append(
                f"has shape {t.shape} x {t.dtype} = {t.numel * itemsize(t.dtype)} bytes,"
                f" but its data_offsets span {end - begin} bytes"
            )
        if end < begin:
            found.append(f"has data_offsets [{begin}, {end}] that end before they begin")
        elif end > data_size:
            truncated = True
            found.append(f"has data_offsets [{begin}, {end}] past the end of the {data_size}-byte data area (truncated?)")
        if found:  # the tensor's name is formatted only for a problem: a sound header has 639 of them
            problems += [f"{file}: tensor {echo(t.name, NAME_LIMIT)} {text}" for text in found]
        if end >= begin:
            spans.append((begin, end, t.name))
    return problems + _coverage_problems(shard, sorted(spans), data_size, truncated)


def _coverage_problems(shard: ShardMeta, spans: list[tuple[int, int, str]], data_size: int, truncated: bool) -> list[str]:
    """Where the tensors, in offset order, fail to tile the data area exactly from 0 to its end.

    safetensors refuses a gap, an overlap and trailing bytes alike (alignment is
    not required: each tensor starts where the one before ends, whatever the
    offset); a byte no tensor owns could hide anything.
    """
    problems = []
    file = echo_name(shard.path.name)
    covered, last = 0, None  # end of the data the tensors so far cover, and the tensor reaching it
    for begin, end, name in spans:
        if begin > covered:
            after = f"tensor {echo(last[2], NAME_LIMIT)} [{last[0]}, {last[1]}]" if last else "the start of the data area"
            problems.append(
                f"{file}: {begin - covered} bytes between {after} and tensor {echo(name, NAME_LIMIT)}"
                f" [{begin}, {end}] belong to no tensor (safetensors refuses gaps)"
            )
        elif begin < covered:
            problems.append(
                f"{file}: tensors {echo(last[2], NAME_LIMIT)} [{last[0]}, {last[1]}]"
                f" and {echo(name, NAME_LIMIT)} [{begin}, {end}] overlap"
            )
        if end >= covered:
            covered, last = end, (begin, end, name)
    if covered < data_size and not truncated and not shard.refused_entries:
        problems.append(
            f"{file}: {data_size - covered} bytes after the last tensor's data belong to no tensor"
            " (safetensors refuses trailing bytes)"
        )
    return problems

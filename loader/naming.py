"""Name mapping: regex renames, then merges of several sources into one target.

Renames apply in order to every checkpoint name. Merges then group renamed
names: a merge rule has one regex per source part and a target template
(`re` replacement syntax) expanded from each part's match; the parts are
concatenated along dim 0 in the rule's order (e.g. q, k, v -> a fused qkv).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .metadata import TensorMeta
from core.echo import NAME_LIMIT, echo
from core.errors import PlacementError, first_of

EXTRA_STATE_SUFFIX = "_extra_state"


@dataclass(frozen=True)
class MergeRule:
    """Sources matching `sources` (in this order) are concatenated along dim 0 into `target`."""

    target: str
    """Replacement template, e.g. `\\1.qkv.weight`, expanded from each source's match."""
    sources: tuple[str, ...]
    """One regex per part, matched in full against (renamed) names."""


@dataclass(frozen=True)
class Target:
    """One destination tensor and the checkpoint tensors that fill it."""

    name: str
    """Name in the module."""
    sources: tuple[TensorMeta, ...]
    """Checkpoint tensors concatenated along dim 0 (one for a plain tensor)."""
    shape: tuple[int, ...]
    """Shape of the destination."""

    @property
    def source_bytes(self) -> int:
        return sum(s.nbytes for s in self.sources)


RenameRules = Mapping[str, str] | Sequence[tuple[str, str]] | None
MergeRules = Mapping[str, Sequence[str]] | Sequence[MergeRule] | None


def _rename_rules(rename: RenameRules) -> list[tuple[re.Pattern, str]]:
    items = rename.items() if isinstance(rename, Mapping) else (rename or [])
    rules = []
    for pattern, repl in items:
        try:
            rules.append((re.compile(pattern), repl))
        except re.error as exc:
            raise PlacementError(f"rename rule {pattern!r} is not a valid regex: {exc}") from None
    return rules


def _merge_rules(merges: MergeRules) -> list[tuple[MergeRule, list[re.Pattern]]]:
    if isinstance(merges, Mapping):
        merges = [MergeRule(target, tuple(sources)) for target, sources in merges.items()]
    rules = []
    for rule in merges or []:
        if len(rule.sources) < 2:
            raise PlacementError(f"merge into {rule.target!r} needs at least two source patterns")
        try:
            rules.append((rule, [re.compile(p) for p in rule.sources]))
        except re.error as exc:
            raise PlacementError(f"merge into {rule.target!r} has an invalid regex: {exc}") from None
    return rules


def rename(name: str, rules: Iterable[tuple[re.Pattern, str]]) -> str:
    for pattern, repl in rules:
        name = pattern.sub(repl, name)
    return name


def plan_targets(
    tensors: Sequence[TensorMeta], rename_rules: RenameRules = None, merges: MergeRules = None
) -> tuple[list[Target], list[TensorMeta]]:
    """(targets in checkpoint order, skipped `*_extra_state` sources).

    Raises PlacementError listing every incomplete merge, duplicate target
    and incompatible merge shape.
    """
    renames = _rename_rules(rename_rules)
    rules = _merge_rules(merges)
    skipped: list[TensorMeta] = []
    singles: list[tuple[str, TensorMeta]] = []
    groups: dict[tuple[int, str], dict[int, TensorMeta]] = {}
    for meta in tensors:
        if meta.name.endswith(EXTRA_STATE_SUFFIX):
            skipped.append(meta)
            continue
        name = rename(meta.name, renames)
        for rule_no, (rule, patterns) in enumerate(rules):
            hit = next(((i, m) for i, p in enumerate(patterns) if (m := p.fullmatch(name))), None)
            if hit is not None:
                part, match = hit
                groups.setdefault((rule_no, match.expand(rule.target)), {})[part] = meta
                break
        else:
            singles.append((name, meta))
    problems: list[str] = []
    order: list[tuple[tuple, Target]] = []
    for name, meta in singles:
        order.append(((meta.file, meta.data_offsets), Target(name, (meta,), meta.shape)))
    for (rule_no, target), parts in groups.items():
        rule = rules[rule_no][0]
        absent = [rule.sources[i] for i in range(len(rule.sources)) if i not in parts]
        if absent:
            problems.append(
                f"merge into {target!r} lacks sources matching {', '.join(map(repr, absent))}"
                f" (found {', '.join(echo(m.name, NAME_LIMIT) for m in parts.values())})"
            )
            continue
        sources = tuple(parts[i] for i in range(len(rule.sources)))
        tails = {s.shape[1:] for s in sources}
        if len(tails) > 1 or any(len(s.shape) == 0 for s in sources):
            problems.append(
                f"merge into {target!r}: sources {', '.join(f'{echo(s.name, NAME_LIMIT)} {s.shape}' for s in sources)}"
                " cannot be concatenated along dim 0"
            )
            continue
        shape = (sum(s.shape[0] for s in sources), *sources[0].shape[1:])
        order.append(((sources[0].file, sources[0].data_offsets), Target(target, sources, shape)))
    seen: dict[str, Target] = {}
    for _, t in order:
        if t.name in seen:
            problems.append(
                f"target {echo(t.name, NAME_LIMIT)} is produced by both {echo(seen[t.name].sources[0].name, NAME_LIMIT)} and "
                f"{echo(t.sources[0].name, NAME_LIMIT)}"
            )
        seen[t.name] = t
    if problems:
        raise PlacementError("; ".join(first_of(sorted(problems))))
    order.sort(key=lambda item: item[0])
    return [t for _, t in order], skipped

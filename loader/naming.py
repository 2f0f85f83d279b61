"""Name mapping: regex renames, splits of one source into several targets, then merges of several sources
into one target.

Renames apply in order to every checkpoint name. Splits then cut a renamed
tensor along dim 0 into row ranges, each a target of its own (a fused qkv ->
q, k, v); a row range of a row-major tensor is a byte range of its file, so
each part is read from disk into its own destination and the whole source is
never held. Merges last group names (renamed ones and split parts): a merge
rule has one regex per source part and a target template (`re` replacement
syntax) expanded from each part's match; the parts are concatenated along
dim 0 in the rule's order (q, k, v -> a fused qkv). A split then a merge
reorders rows: split `[gate; value]` into two parts, merge them back as
`[value; gate]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from .metadata import TensorMeta
from core.echo import NAME_LIMIT, echo, echo_name
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
class SplitRule:
    """A source matching `source` is cut along dim 0 into `groups` blocks of `len(targets)` equal parts:
    target i takes part i of every block, in block order. `groups=1` splits a stacked `[a; b; c]`;
    `groups=heads` a per-head interleave `[h0: a b c, h1: a b c, ...]`."""

    source: str
    """Regex matched in full against (renamed) names."""
    targets: tuple[str, ...]
    """Replacement templates, expanded from the source's match, one per part."""
    groups: int = 1
    """Blocks the rows form, each cut alike."""


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
SplitRules = Sequence[SplitRule] | None


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


def _split_rules(splits: SplitRules) -> list[tuple[SplitRule, re.Pattern]]:
    rules = []
    for rule in splits or []:
        if len(rule.targets) < 2 or rule.groups < 1:
            raise PlacementError(f"split of {rule.source!r} needs at least two targets and at least one group")
        try:
            rules.append((rule, re.compile(rule.source)))
        except re.error as exc:
            raise PlacementError(f"split of {rule.source!r} has an invalid regex: {exc}") from None
    return rules


def row_range(meta: TensorMeta, start: int, rows: int) -> TensorMeta:
    """Rows `start .. start + rows` of `meta` (dim 0) as a tensor of their own: the same file, a narrower byte
    range, named `name[start:end]`."""
    row_bytes = meta.nbytes // meta.shape[0] if meta.shape[0] else 0
    begin = meta.data_offsets[0] + start * row_bytes
    return replace(meta, name=f"{meta.name}[{start}:{start + rows}]", shape=(rows, *meta.shape[1:]),
                   data_offsets=(begin, begin + rows * row_bytes))


def _split(meta: TensorMeta, rule: SplitRule, match: re.Match) -> list[tuple[str, tuple[TensorMeta, ...]]]:
    """(target name, its row ranges) for each of `rule`'s targets, or PlacementError naming the tensor."""
    parts = len(rule.targets) * rule.groups
    if not meta.shape or meta.shape[0] % parts:
        raise PlacementError(f"{echo(meta.name, NAME_LIMIT)} of shape {meta.shape} in {echo_name(meta.file.name)}: "
                             f"cannot be split into "
                             f"{rule.groups} x {len(rule.targets)} equal row blocks for {', '.join(rule.targets)}")
    rows = meta.shape[0] // parts
    return [(match.expand(target), tuple(row_range(meta, (g * len(rule.targets) + i) * rows, rows)
                                         for g in range(rule.groups)))
            for i, target in enumerate(rule.targets)]


def rename(name: str, rules: Iterable[tuple[re.Pattern, str]]) -> str:
    for pattern, repl in rules:
        name = pattern.sub(repl, name)
    return name


def plan_targets(
    tensors: Sequence[TensorMeta], rename_rules: RenameRules = None, merges: MergeRules = None,
    splits: SplitRules = None,
) -> tuple[list[Target], list[TensorMeta]]:
    """(targets in checkpoint order, skipped `*_extra_state` sources).

    Raises PlacementError listing every incomplete merge, duplicate target
    and incompatible merge shape, or naming a tensor a split cannot cut evenly.
    """
    renames = _rename_rules(rename_rules)
    cuts = _split_rules(splits)
    rules = _merge_rules(merges)
    skipped: list[TensorMeta] = []
    entries: list[tuple[str, tuple[TensorMeta, ...]]] = []
    for meta in tensors:
        if meta.name.endswith(EXTRA_STATE_SUFFIX):
            skipped.append(meta)
            continue
        name = rename(meta.name, renames)
        cut = next(((rule, m) for rule, pattern in cuts if (m := pattern.fullmatch(name))), None)
        entries.extend(_split(meta, *cut) if cut else [(name, (meta,))])
    singles: list[tuple[str, tuple[TensorMeta, ...]]] = []
    groups: dict[tuple[int, str], dict[int, tuple[TensorMeta, ...]]] = {}
    for name, pieces in entries:
        for rule_no, (rule, patterns) in enumerate(rules):
            hit = next(((i, m) for i, p in enumerate(patterns) if (m := p.fullmatch(name))), None)
            if hit is not None:
                part, match = hit
                groups.setdefault((rule_no, match.expand(rule.target)), {})[part] = pieces
                break
        else:
            singles.append((name, pieces))
    problems: list[str] = []
    order: list[tuple[tuple, Target]] = []
    for name, pieces in singles:
        shape = (sum(p.shape[0] for p in pieces), *pieces[0].shape[1:]) if len(pieces) > 1 else pieces[0].shape
        order.append(((pieces[0].file, pieces[0].data_offsets), Target(name, pieces, shape)))
    for (rule_no, target), parts in groups.items():
        rule = rules[rule_no][0]
        absent = [rule.sources[i] for i in range(len(rule.sources)) if i not in parts]
        if absent:
            problems.append(
                f"merge into {target!r} lacks sources matching {', '.join(map(repr, absent))}"
                f" (found {', '.join(echo(m[0].name, NAME_LIMIT) for m in parts.values())})"
            )
            continue
        sources = tuple(piece for i in range(len(rule.sources)) for piece in parts[i])
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

"""MiniMax H3's DiT as one file in the reference (original) layout: Comfy-Org's repackaged H3 files.

Such a file names tensors as the reference code does (`blocks.N.attn.qkv_proj.weight` with q, k and v
stacked, `mlp.fc1` as `[gate; value]`, `video_patch_proj`, `final_layer.*`). diffusers converts it in
memory (`MiniMaxH3Transformer3DModel.from_single_file`); here the same facts are loader rules, so each
tensor is read from disk straight into its place in diffusers' class and no converted state dict is ever
held (the loader's `SplitRule` reads each of q, k, v from its own byte range):

- renames (`blocks.` -> `transformer_blocks.`, `mlp.fc1` -> `ff.net.0.proj`, `final_layer.video_out` ->
  `proj_out`, ...);
- every `attn.qkv_proj.weight` split into `to_q`, `to_k`, `to_v`: `stacked` rows `[q; k; v]` (every
  published single file), or `interleaved` per head `[h0: q k v, h1: ...]` (a file merged by hand from
  the MiniMaxAI shards). The file cannot tell the two apart, so the user says which; stacked by default;
- every `ff.net.0.proj.weight` has its halves swapped: `[gate; value]` on disk, `[value; gate]` in
  diffusers' SwiGLU (a split into two parts, merged back the other way round);
- `rope.inv_freq` is not read: diffusers' class computes it from its config.

A pruned file (`adaln_t_table` in place of `time_embedder`) has no diffusers class and is refused in one
line, as diffusers refuses it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from core.echo import echo_name
from core.errors import DrainboardError
from loader.naming import MergeRule, SplitRule

from .formats import file_problem, packed_problem
from ..request.cli_args import QKV_LAYOUTS


class Shaped(Protocol):
    """A tensor as a header describes it (a safetensors `TensorMeta`, a `GgufTensor`): its name and shape."""

    name: str
    shape: tuple[int, ...]


PRUNED_TENSOR = "adaln_t_table"
"""The tensor a pruned H3 DiT has in place of `time_embedder` (no diffusers class takes it)."""
NOT_READ = ("rope.inv_freq",)
"""Tensors of a reference file diffusers' class computes itself."""
FUSED_QKV = re.compile(r"blocks\.(\d+)\.attn\.qkv_proj\.weight")
"""A DiT block's fused q, k, v in the reference naming."""
_SEAM = "#part"
"""Marks the halves of a gated feed-forward weight between its split and its merge (no real name has it)."""

RENAMES: tuple[tuple[str, str], ...] = (
    (r"^blocks\.", "transformer_blocks."),
    *((re.escape(old), new) for old, new in (
        ("token_refiner.blocks.", "token_refiner.refiner_blocks."),
        ("time_embedder.proj_in.", "time_embedder.linear_1."),
        ("time_embedder.proj_out.", "time_embedder.linear_2."),
        ("video_patch_proj.", "proj_in."),
        ("audio_patch_proj.", "audio_proj_in."),
        ("condition_proj.", "context_embedder."),
        ("final_layer.norm.", "norm_out.norm."),
        ("final_layer.adaln_proj.linear.", "norm_out.linear."),
        ("final_layer.video_out.", "proj_out."),
        ("final_layer.audio_out.", "audio_proj_out."),
        (".attn.q_norm.", ".attn.norm_q."),
        (".attn.k_norm.", ".attn.norm_k."),
        (".attn.out_proj.", ".attn.to_out.0."),
        (".mlp.fc1.", ".ff.net.0.proj."),
        (".mlp.fc2.", ".ff.net.2."),
    )),
)
"""Reference name -> diffusers name, applied in order (the facts of diffusers' converter)."""


@dataclass(frozen=True)
class ReferenceLayout:
    """The loader rules that place a reference-layout H3 DiT into diffusers' class."""

    rename: tuple[tuple[str, str], ...]
    splits: tuple[SplitRule, ...]
    merges: tuple[MergeRule, ...]
    exclude: Callable[[str], bool]


def reference_layout(config: dict, qkv_layout: str = "stacked") -> ReferenceLayout:
    """The rules for a DiT of `config` (its `num_attention_heads` cut an interleaved qkv) and `qkv_layout`."""
    if qkv_layout not in QKV_LAYOUTS:
        raise DrainboardError(f"qkv_layout must be one of {', '.join(QKV_LAYOUTS)}, got {qkv_layout!r}")
    heads = int(config.get("num_attention_heads", 1)) if qkv_layout == "interleaved" else 1
    qkv = SplitRule(r"(.*\.attn\.)qkv_proj\.weight", (r"\1to_q.weight", r"\1to_k.weight", r"\1to_v.weight"),
                    groups=heads)
    gated = re.escape(".ff.net.0.proj.weight")
    halves = SplitRule(rf"(.*{gated})", (rf"\1{_SEAM}0", rf"\1{_SEAM}1"))
    swap = MergeRule(r"\1", (rf"(.*{gated}){_SEAM}1", rf"(.*{gated}){_SEAM}0"))
    return ReferenceLayout(RENAMES, (qkv, halves), (swap,), lambda name: name in NOT_READ)


def is_reference_h3(tensors: Sequence[Shaped]) -> bool:
    """Whether these tensors are an H3 DiT in the reference naming: patch and output projections named so,
    and a fused `qkv_proj` of rows a multiple of three (q, k, v of heads x head dim rows each: 3 x 7168 rows
    of width 5376 in the released DiT) in every block."""
    shapes = {t.name: t.shape for t in tensors}
    fused = [shape for name, shape in shapes.items() if FUSED_QKV.fullmatch(name)]
    return ("video_patch_proj.weight" in shapes and "final_layer.video_out.weight" in shapes and bool(fused)
            and all(len(s) == 2 and s[0] > 0 and s[0] % 3 == 0 for s in fused))


def generate_checkpoint_problem(index) -> str | None:
    """Why a discovered checkpoint (`loader.CheckpointIndex`) cannot be a generate's model, in one line, or None:
    a lone file or component folder is no model folder; a model folder's DiT may be packed."""
    if index.layout != "model":
        what = "a single file" if index.layout == "file" else "a component folder"
        tensors = index.component().tensors
        known = "holding a MiniMax H3 DiT in the original layout" if is_reference_h3(tensors) else "of an unknown model"
        return (f"{echo_name(index.path.name)}: {what} {known} ({len(tensors)} tensors), not a MiniMax H3 model folder "
                f"(modular_model_index.json and its components); a single-file DiT goes in --transformer (the Run "
                f"page's Single-file transformer) with the model folder that supplies the rest")
    dit = index.components.get("transformer")
    return None if dit is None else packed_problem(dit.tensors, f"{echo_name(index.path.name)}/transformer")


def pruned_problem(tensors: Sequence[Shaped]) -> str | None:
    """The one line that refuses a pruned H3 DiT, or None."""
    table = next((t for t in tensors if t.name == PRUNED_TENSOR), None)
    if table is None:
        return None
    return (f"a pruned MiniMax H3 DiT: it has {PRUNED_TENSOR} {table.shape} in place of time_embedder, which "
            f"diffusers' MiniMaxH3Transformer3DModel does not take; use the unpruned DiT")


def diffusers_name(name: str) -> str:
    """`name` of a reference-layout file as diffusers' class calls it (renames only: a fused qkv keeps its name)."""
    for pattern, repl in RENAMES:
        name = re.sub(pattern, repl, name)
    return name


def transformer_problem(path: str, config: dict) -> str | None:
    """Why the file at `path` cannot be the DiT of a model whose `transformer/config.json` is `config`, in one
    line, or None: from its headers alone (read confined to its own folder). A `.gguf` file is checked by
    `models.checkpoint.gguf.gguf_problem` instead."""
    from loader.checkpoint import discover_checkpoint

    file = Path(path)
    if not file.is_file():
        return f"{echo_name(file)}: not a file (a single-file DiT is one .safetensors or .gguf file)"
    problem = file_problem(file)
    if problem is not None:
        return problem
    try:
        tensors = discover_checkpoint(file).component().tensors
    except DrainboardError as exc:
        return exc.messages()[0]
    return packed_problem(tensors, echo_name(file.name)) or layout_problem(echo_name(file.name), tensors, config)


def layout_problem(where: str, tensors: Sequence[Shaped], config: dict) -> str | None:
    """Why these tensors (a single file's, named `where`) are no DiT of the model `config` describes: pruned,
    not H3 in the reference naming, or of another size; None when they are."""
    pruned = pruned_problem(tensors)
    if pruned is not None:
        return f"{where}: {pruned}"
    if not is_reference_h3(tensors):
        names = ", ".join(echo_name(t.name) for t in tensors[:3]) or "none"
        return (f"{where}: not a MiniMax H3 DiT in the original layout (no video_patch_proj, final_layer.video_out "
                f"and blocks.N.attn.qkv_proj of 3 x n rows; its first tensors: {names})")
    fused = [t for t in tensors if FUSED_QKV.fullmatch(t.name)]
    blocks, width = len(fused), fused[0].shape[1]
    layers, hidden = int(config.get("num_layers", -1)), int(config.get("hidden_size", -1))
    if (blocks, width) != (layers, hidden):
        return (f"{where}: a DiT of {blocks} blocks of width {width}, but the model's transformer/config.json "
                f"says {layers} blocks of width {hidden}; give --model the folder of the same model size")
    return None


def header_tensors(file: Path) -> Sequence[Shaped]:
    """A single-file DiT's tensors as its header describes them (a `.gguf` one's by `loader.gguf_header`)."""
    from loader.checkpoint import discover_checkpoint
    from loader.gguf_header import is_gguf, read_gguf_header

    return read_gguf_header(file).tensors if is_gguf(file) else discover_checkpoint(file).component().tensors


def config_fit_problem(tensors: Sequence[Shaped], config: dict) -> str | None:
    """The first way these reference-layout tensors differ from the DiT `config` builds (built on meta, no
    weight): a shape, a tensor the class lacks or one the file lacks; None when every tensor fits."""
    from .classes import build_empty

    expected = {n: tuple(t.shape) for n, t in build_empty(config).state_dict().items() if n not in NOT_READ}
    found: dict[str, tuple[int, ...]] = {}
    for t in tensors:
        if t.name in NOT_READ:
            continue
        name = diffusers_name(t.name)
        if name.endswith(".attn.qkv_proj.weight"):
            stem = name.removesuffix("qkv_proj.weight")
            found |= {f"{stem}to_{x}.weight": (t.shape[0] // 3, *t.shape[1:]) for x in "qkv"}
        else:
            found[name] = tuple(t.shape)
    for name, shape in found.items():
        if name not in expected:
            return f"it has {echo_name(name)}, which that DiT has not"
        if shape != expected[name]:
            return f"{echo_name(name)} is {shape} in the file, {expected[name]} in that DiT"
    missing = [n for n in expected if n not in found]
    return f"it lacks {echo_name(missing[0])} and {len(missing) - 1} more" if missing else None

"""Write an H3 DiT as a single file in the reference layout (Comfy-Org's), by inverting diffusers' conversion.

The test writes the file itself, so the layout facts are checked against diffusers' own
`from_single_file`, never against the code under test.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors.torch import load_file

_BACK = [
    ("token_refiner.refiner_blocks.", "token_refiner.blocks."),
    ("time_embedder.linear_1.", "time_embedder.proj_in."),
    ("time_embedder.linear_2.", "time_embedder.proj_out."),
    ("audio_proj_in.", "audio_patch_proj."),
    ("context_embedder.", "condition_proj."),
    ("norm_out.norm.", "final_layer.norm."),
    ("norm_out.linear.", "final_layer.adaln_proj.linear."),
    ("audio_proj_out.", "final_layer.audio_out."),
    (".attn.norm_q.", ".attn.q_norm."),
    (".attn.norm_k.", ".attn.k_norm."),
    (".attn.to_out.0.", ".attn.out_proj."),
    (".ff.net.0.proj.", ".mlp.fc1."),
    (".ff.net.2.", ".mlp.fc2."),
]
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.uint8: "U8"}


def _reference_name(name: str) -> str:
    if name.startswith("proj_in."):
        name = "video_patch_proj." + name[len("proj_in."):]
    if name.startswith("proj_out."):
        name = "final_layer.video_out." + name[len("proj_out."):]
    if name.startswith("transformer_blocks."):
        name = "blocks." + name[len("transformer_blocks."):]
    for new, old in _BACK:
        name = name.replace(new, old)
    return name


def reference_tensors(transformer: Path, *, qkv_layout: str = "stacked") -> dict[str, torch.Tensor]:
    """The diffusers-layout DiT in `transformer` (a component folder) as the reference layout names it."""
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(transformer.glob("*.safetensors")):
        state.update(load_file(str(shard)))
    heads = json.loads((transformer / "config.json").read_text())["num_attention_heads"]
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith(".attn.to_q.weight"):
            stem = name[: -len("to_q.weight")]
            q, k, v = (state[stem + f"to_{x}.weight"] for x in "qkv")
            if qkv_layout == "interleaved":
                fused = torch.stack([t.unflatten(0, (heads, -1)) for t in (q, k, v)], dim=1).flatten(0, 2)
            else:
                fused = torch.cat([q, k, v])
            out[_reference_name(stem + "qkv_proj.weight")] = fused
        elif ".attn.to_k." in name or ".attn.to_v." in name:
            continue
        elif name.endswith(".ff.net.0.proj.weight"):
            value, gate = tensor.chunk(2)
            out[_reference_name(name)] = torch.cat([gate, value])  # diffusers' SwiGLU reads [value; gate]
        else:
            out[_reference_name(name)] = tensor
    return out


def write_single_file(tensors: dict[str, torch.Tensor], path: Path, *, data_start_mod8: int = 0) -> Path:
    """A safetensors file whose data area starts at an offset that is `data_start_mod8` modulo 8 (the header
    padded with spaces to get there), so with an odd value no tensor is 8-byte, or even 2-byte, aligned."""
    header, offset, blobs = {}, 0, []
    for name, tensor in tensors.items():
        raw = tensor.contiguous().view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((data_start_mod8 - 8 - len(text)) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def write_gguf(tensors: dict[str, torch.Tensor], path: Path, quant: str = "Q8_0") -> Path:
    """A GGUF file of `tensors` written with the `gguf` package's own writer and quantizer, as community GGUFs
    of the single files are made: each 2-D weight whose rows fill whole blocks in `quant`, the rest in F32."""
    import gguf

    kind = gguf.GGMLQuantizationType[quant]
    block, _ = gguf.GGML_QUANT_SIZES[kind]
    writer = gguf.GGUFWriter(str(path), arch="minimax_h3")
    for name, tensor in tensors.items():
        values = tensor.float().numpy()
        if tensor.ndim == 2 and values.shape[-1] % block == 0:
            packed = gguf.quants.quantize(values, kind)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=kind)
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_header_only(shapes: dict[str, tuple[int, ...]], path: Path) -> Path:
    """A bf16 single file in the reference layout with tensors of these diffusers-layout `shapes` (fused qkv of
    three times the rows), its data area a hole: a sparse file of the full size, so a real-size DiT's headers
    can be checked on a small disk."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        if ".attn.to_k." in name or ".attn.to_v." in name:
            continue
        if name.endswith(".attn.to_q.weight"):
            name, shape = name.replace("to_q.weight", "qkv_proj.weight"), (3 * shape[0], *shape[1:])
        size = 2
        for d in shape:
            size *= d
        header[_reference_name(name)] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)
    return path

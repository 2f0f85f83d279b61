"""LoRA merge benchmark (not a test): the DiT loaded with a LoRA on every Linear, merged while it streams, against
the same load without it, against the merge's arithmetic alone, and against diffusers' own `load_lora_adapter` +
`fuse_lora`, side by side in one run.

Each case runs in a fresh subprocess (the same memory baseline each time; the page cache warmed first), the
cases interleaved `--repeat` times, medians shown. Per case: wall seconds of the load, to the DiT fused in place
(for `merged`, preparing the LoRA, its file hashed and its header converted, happens before the load's first tensor
is read and is timed apart as `prep`; for `diffusers`, from its first byte read), and the peak resident growth over
the process after its imports, preparation included (VmHWM - VmRSS then), as a ratio of the DiT's bytes, with
glibc's mmap threshold fixed as every entry point fixes it (`loader.process`); on CUDA also torch's peak allocated
device memory. PEFT, which a LoRA job imports and a plain one does not, is imported before the clock in every case
(so the baselines match) and its import timed apart; so is one tiny float32 matmul (BLAS's code paged in, as the
DiT's first call pages it in any job).

    python bench/bench_lora.py data/models/h3-demo --ranks 64 4 --repeat 3
    python bench/bench_lora.py /tmp/h3-sparse --sparse h3 --device cuda --quantize fp8 --repeat 1   # one H200

`plain`: `load_component` of the transformer in bf16. `merged`: the same load, the LoRA's factors read a module at
a time and converted through diffusers (`models.lora.merge`), merged by the loader's `adjust` as each weight is
placed. `floor`: the same merges alone (`merge_delta` on zeroed weights and factors already in memory, on the same
device): no merged load can beat plain + floor. `diffusers`: `from_pretrained` in bf16 (onto the device, by
`device_map`, on CUDA), the same file through `lora_state_dict` + `load_lora_adapter`, then `fuse_lora`.
With `--quantize`: `plain-q` and `merged-q`, the same two loads quantized as each Linear is placed (merged first).
`--sparse PROFILE` first writes that profile's DiT with every shard's data a hole (zeros, no disk: what
`bench/check_forecast_cuda.py` does) into the model folder; it says nothing about quality, only memory and time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = ("plain", "merged", "floor", "diffusers")
QUANTIZED_CASES = ("plain-q", "merged-q")

_CASE = r"""
import json, sys, time
case, root, lora, repo, roots, device, quantize, threads = sys.argv[1:9]
sys.path.insert(0, repo)
import torch
if threads:
    torch.set_num_threads(int(threads))
t0 = time.perf_counter()
import peft, peft.tuners.lora  # what a LoRA job imports beyond a plain one: before the clock in every case, timed
import diffusers.loaders.peft
import_seconds = time.perf_counter() - t0
from models.checkpoint.components import load_component
from models.lora.inputs import LoraInput
from models.lora.merge import merge_adjustments
from diffusers import MiniMaxH3Transformer3DModel
from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

from loader.process import configure_process
configure_process(device)  # as a job child does first: freed temporaries leave the resident set
torch.matmul(torch.ones(8, 8), torch.ones(8, 8)).bfloat16().float()  # BLAS paged in, as a DiT's first call does
cuda = device.startswith("cuda")
if cuda:
    torch.ones(1, device=device)  # the context, before the baseline
    torch.cuda.reset_peak_memory_stats(device)
def sync():
    if cuda:
        torch.cuda.synchronize(device)
config = json.load(open(f"{root}/transformer/config.json"))
base = status("VmRSS")
extra = {}
t = time.perf_counter()
if case == "floor":  # the merge's arithmetic alone: the same merges on weights and factors already in memory
    from models.lora.merge import merge_delta
    from models.checkpoint.classes import build_empty
    from safetensors.torch import load_file
    factors = load_file(lora)
    pairs = []
    for name, m in build_empty(config).named_modules():
        if isinstance(m, torch.nn.Linear):
            pairs.append((name, m.out_features, m.in_features))
    placed = 0
    seconds = 0.0
    for name, rows, cols in pairs:  # one weight on the device at a time: the floor needs no room for a whole DiT
        weight = torch.zeros(rows, cols, dtype=torch.bfloat16, device=device)
        a, b = factors[f"transformer.{name}.lora_A.weight"], factors[f"transformer.{name}.lora_B.weight"]
        sync()
        start = time.perf_counter()
        merge_delta(weight, a, b, 1.0)
        sync()
        seconds += time.perf_counter() - start
        placed += weight.nbytes
        del weight
elif case == "diffusers":
    kwargs = {"device_map": device} if cuda else {}
    dit = MiniMaxH3Transformer3DModel.from_pretrained(f"{root}/transformer", torch_dtype=torch.bfloat16, **kwargs)
    state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(lora, return_lora_metadata=True)
    dit.load_lora_adapter(state, prefix="transformer", metadata=metadata, adapter_name="a")
    del state
    dit.fuse_lora()
    sync()
    seconds = time.perf_counter() - t
    placed = sum(p.nbytes for n, p in dit.named_parameters() if "lora_" not in n)
else:
    adjust, merge = (None, None)
    if case.startswith("merged"):  # preparing the LoRA, its own stage before the load: timed apart
        adjust, merge = merge_adjustments([LoraInput(lora, 1.0, partition="transformer")], "transformer", config,
                                          [roots])
        t = time.perf_counter()
    q = quantize if case.endswith("-q") else None
    dit, report = load_component(root, "transformer", dtype=torch.bfloat16, adjust=adjust, roots=[roots],
                                 device=device, quantize=q)
    sync()
    seconds = time.perf_counter() - t
    del adjust
    placed = report.bytes_placed
    if merge is not None:
        extra = {"factor_bytes": merge.factor_bytes, "prep_seconds": merge.read_seconds,
                 "group_seconds": merge.group_seconds, "merge_seconds": merge.merge_seconds,
                 "held_peak_bytes": merge.held_peak_bytes}
if cuda:
    extra["device_peak_bytes"] = torch.cuda.max_memory_allocated(device)
print(json.dumps({"seconds": seconds, "peak_bytes": status("VmHWM") - base, "placed": placed,
                  "import_seconds": import_seconds, **extra}))
"""


def write_lora(root: Path, out: Path, rank: int) -> Path:
    """A PEFT-layout LoRA of `rank` on every Linear of the DiT at `root` (bf16, seeded), written a tensor at a time."""
    import torch
    from safetensors.torch import save_file

    from models.checkpoint.classes import build_empty

    module = build_empty(json.loads((root / "transformer" / "config.json").read_text()))
    g = torch.Generator().manual_seed(rank)
    tensors = {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear):
            tensors[f"transformer.{name}.lora_A.weight"] = (torch.randn(rank, m.in_features, generator=g) * 0.01).bfloat16()
            tensors[f"transformer.{name}.lora_B.weight"] = (torch.randn(m.out_features, rank, generator=g) * 0.01).bfloat16()
    save_file(tensors, out)
    return out


def warm(folder: Path) -> None:
    """Read every shard once in 64 MiB pieces, so every case reads the page cache (holes cost nothing)."""
    for shard in folder.glob("*.safetensors"):
        with open(shard, "rb") as f:
            while f.read(1 << 26):
                pass


def run_case(case: str, root: Path, lora: Path, args) -> dict:
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", _CASE, case, str(root), str(lora), repo, str(root.parent), args.device,
                           args.quantize or "", str(args.threads or "")], capture_output=True, text=True,
                          timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"case {case} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    from models.lora.inputs import LoraInput, inspect_lora

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="an H3 model folder (python -m models synth DIR --profile demo)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[64], help="LoRA ranks (default: 64)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case, interleaved (default: 3)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--quantize", choices=["int8", "fp8"], help="add plain-q and merged-q, quantized loads")
    parser.add_argument("--sparse", metavar="PROFILE", help="first write PROFILE's DiT into MODEL as holes (zeros)")
    parser.add_argument("--cases", nargs="+", help=f"run only these (default: {' '.join(CASES)}, and the quantized)")
    parser.add_argument("--threads", type=int, help="torch's CPU threads in every case (default: torch's own)")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds one case may take (default: 1200)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    root = args.model.resolve()
    if args.sparse:
        from bench.check_forecast_cuda import write_sparse_h3

        write_sparse_h3(root, args.sparse, components=["transformer"])
    cases = args.cases or [*CASES, *(QUANTIZED_CASES if args.quantize else ())]
    warm(root / "transformer")
    rows = []
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        for rank in args.ranks:
            lora = write_lora(root, Path(tmp) / f"rank{rank}.safetensors", rank)
            facts = inspect_lora(LoraInput(str(lora)), root, "t2va", [root.parent], hash_file=False)
            runs: dict[str, list[dict]] = {case: [] for case in cases}
            for _ in range(args.repeat):
                for case in cases:
                    runs[case].append(run_case(case, root, lora, args))
                    print(f"rank {rank} {case}: {json.dumps(runs[case][-1])}", file=sys.stderr, flush=True)
            med = {case: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for case, rs in runs.items()}
            rows.append(_row(rank, lora, facts, med))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    _print(rows, root, args)
    return 0


def _row(rank: int, lora: Path, facts, med: dict) -> dict:
    placed = med["plain"]["placed"] if "plain" in med else next(iter(med.values()))["placed"]
    row = {"rank": rank, "lora_file_bytes": lora.stat().st_size, "dit_bytes": placed,
           "forecast_held_bytes": facts.held_bytes + facts.merge_bytes}
    for case, m in med.items():
        row[f"{case}_seconds"] = m["seconds"]
        if case != "floor":
            row[f"{case}_peak_ratio"] = m["peak_bytes"] / placed
        if "device_peak_bytes" in m:
            row[f"{case}_device_peak_ratio"] = m["device_peak_bytes"] / m["placed"]
        for key in ("prep_seconds", "group_seconds", "merge_seconds", "held_peak_bytes", "factor_bytes",
                    "import_seconds"):
            if key in m:
                row[f"{case}_{key}"] = m[key]
    if "merged" in med and "plain" in med:
        row["measured_extra_bytes"] = med["merged"]["peak_bytes"] - med["plain"]["peak_bytes"]
    return row


def _print(rows: list[dict], root: Path, args) -> None:
    threads = f", {args.threads} torch thread(s)" if args.threads else ""
    print(f"{root.name} DiT, bf16, {args.device}{threads}, medians of {args.repeat} interleaved runs each in a fresh"
          " process")
    for r in rows:
        print(f"rank {r['rank']}: LoRA {r['lora_file_bytes'] / 2**20:.1f} MiB, DiT {r['dit_bytes'] / 2**20:.1f} MiB")
        plain = r.get("plain_seconds")
        for case in (*CASES, *QUANTIZED_CASES):
            if f"{case}_seconds" not in r:
                continue
            seconds = r[f"{case}_seconds"]
            line = f"  {case:<10}{seconds:>9.2f} s"
            if plain and case != "plain":
                line += f"  {seconds / plain:6.2f}x plain" if case != "floor" else \
                    f"  (plain + floor) / plain {(plain + seconds) / plain:.2f}x"
            if f"{case}_peak_ratio" in r:
                line += f"  host peak {r[f'{case}_peak_ratio']:.3f}x DiT"
                if case != "plain" and "plain_peak_ratio" in r:
                    line += f" ({r[f'{case}_peak_ratio'] / r['plain_peak_ratio']:.3f}x plain's)"
            if f"{case}_device_peak_ratio" in r:
                line += f"  device peak {r[f'{case}_device_peak_ratio']:.3f}x its weights"
            if f"{case}_prep_seconds" in r:
                line += (f"  prep {r[f'{case}_prep_seconds']:.2f} s, in the load: groups {r[f'{case}_group_seconds']:.2f}"
                         f" s, merges {r[f'{case}_merge_seconds']:.2f} s")
            print(line)
        if "merged_held_peak_bytes" in r:
            print(f"  held at once: {r['merged_held_peak_bytes'] / 2**20:.2f} MiB of converted factors (of "
                  f"{r['merged_factor_bytes'] / 2**20:.1f}); the forecast adds {r['forecast_held_bytes'] / 2**20:.2f} MiB"
                  f" while the DiT loads; measured merged - plain peak: {r.get('measured_extra_bytes', 0) / 2**20:.2f} MiB")
    print("floor: the same merges alone, on weights and factors already in memory (no read, no conversion)")
    print("peft's import, once per LoRA job and outside the clocks: "
          + ", ".join(f"{r['merged_import_seconds']:.1f} s" for r in rows if "merged_import_seconds" in r))


if __name__ == "__main__":
    sys.exit(main())

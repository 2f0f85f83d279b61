"""LoRA merge benchmark (not a test): the DiT loaded with a LoRA on every Linear, merged while it streams, against
the same load without it, and against diffusers' own `load_lora_adapter` + `fuse_lora`, side by side in one run.

Each case runs in a fresh subprocess (the same memory baseline each time; the page cache warmed first), the
cases interleaved `--repeat` times, medians shown. Per case: wall seconds of the load, to the DiT fused in place
(for `merged`, preparing the LoRA, its factors read and converted and PEFT's scales learnt, happens before the
load's first tensor is read and is timed apart as `prep`; for `diffusers`, from its first byte read), and the peak
resident growth over the process after its imports, preparation included (VmHWM - VmRSS then), as a ratio of the
DiT's bytes, with glibc's mmap threshold fixed as every entry point fixes it (`loader.process`). PEFT, which a
LoRA job imports and a plain one does not, is imported before the clock in every case (so the baselines match) and
its import timed apart.

    python bench/bench_lora.py data/models/h3-demo --ranks 64 4 --repeat 3

`plain`: `load_component` of the transformer in bf16. `merged`: the LoRA's factors read and converted through
diffusers (`models.lora_merge`), merged by the loader's `adjust` as each weight is placed. `diffusers`:
`from_pretrained` in bf16, the same file through `lora_state_dict` + `load_lora_adapter`, then `fuse_lora`.
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

CASES = ("plain", "merged", "diffusers", "floor")

_CASE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[4])
import torch
t0 = time.perf_counter()
import peft, peft.tuners.lora  # what a LoRA job imports beyond a plain one: before the clock in every case, timed
import diffusers.loaders.peft
import_seconds = time.perf_counter() - t0
from models.components import load_component
from models.lora_inputs import LoraInput
from models.lora_merge import merge_adjustments
from diffusers import MiniMaxH3Transformer3DModel
from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

from loader.process import configure_process
configure_process()  # as a job child does first: freed temporaries leave the resident set
torch.matmul(torch.ones(8, 8), torch.ones(8, 8)).bfloat16().float()  # BLAS paged in, as a DiT's first call does
case, root, lora = sys.argv[1], sys.argv[2], sys.argv[3]
config = json.load(open(f"{root}/transformer/config.json"))
base = status("VmRSS")
t = time.perf_counter()
if case == "floor":  # the merge's arithmetic alone: the same merges on weights and factors already in memory
    from models.lora_merge import merge_delta
    from models.classes import build_empty
    from safetensors.torch import load_file
    factors = load_file(lora)
    pairs = []
    for name, m in build_empty(config).named_modules():
        if isinstance(m, torch.nn.Linear):
            pairs.append((torch.zeros(m.out_features, m.in_features, dtype=torch.bfloat16),
                          factors[f"transformer.{name}.lora_A.weight"], factors[f"transformer.{name}.lora_B.weight"]))
    t = time.perf_counter()
    for weight, a, b in pairs:
        merge_delta(weight, a, b, 1.0)
    placed = sum(w.nbytes for w, _, _ in pairs)
    extra = {}
elif case == "diffusers":
    dit = MiniMaxH3Transformer3DModel.from_pretrained(f"{root}/transformer", torch_dtype=torch.bfloat16)
    state, metadata = MiniMaxH3LoraLoaderMixin.lora_state_dict(lora, return_lora_metadata=True)
    dit.load_lora_adapter(state, prefix="transformer", metadata=metadata, adapter_name="a")
    del state
    dit.fuse_lora()
    placed = sum(p.nbytes for n, p in dit.named_parameters() if "lora_" not in n)
    extra = {}
else:
    adjust, merge = (None, None)
    if case == "merged":  # preparing the LoRA, its own stage before the load: timed apart
        adjust, merge = merge_adjustments([LoraInput(lora, 1.0, partition="transformer")], "transformer", config,
                                          [str(sys.argv[5])])
        t = time.perf_counter()
    dit, report = load_component(root, "transformer", dtype=torch.bfloat16, adjust=adjust, roots=[sys.argv[5]])
    del adjust
    placed = report.bytes_placed
    extra = {} if merge is None else {"factor_bytes": merge.factor_bytes, "prep_seconds": merge.read_seconds,
                                      "group_seconds": merge.group_seconds, "merge_seconds": merge.merge_seconds,
                                      "held_peak_bytes": merge.held_peak_bytes}
seconds = time.perf_counter() - t
print(json.dumps({"seconds": seconds, "peak_bytes": status("VmHWM") - base, "placed": placed,
                  "import_seconds": import_seconds, **extra}))
"""


def write_lora(root: Path, out: Path, rank: int) -> Path:
    """A PEFT-layout LoRA of `rank` on every Linear of the DiT at `root` (bf16, seeded)."""
    import torch
    from safetensors.torch import save_file

    from models.classes import build_empty

    module = build_empty(json.loads((root / "transformer" / "config.json").read_text()))
    g = torch.Generator().manual_seed(rank)
    tensors = {}
    for name, m in module.named_modules():
        if isinstance(m, torch.nn.Linear):
            tensors[f"transformer.{name}.lora_A.weight"] = (torch.randn(rank, m.in_features, generator=g) * 0.01).bfloat16()
            tensors[f"transformer.{name}.lora_B.weight"] = (torch.randn(m.out_features, rank, generator=g) * 0.01).bfloat16()
    save_file(tensors, out)
    return out


def run_case(case: str, root: Path, lora: Path) -> dict:
    repo = str(Path(__file__).resolve().parents[1])
    done = subprocess.run([sys.executable, "-c", _CASE, case, str(root), str(lora), repo, str(root.parent)],
                          capture_output=True, text=True, check=True, timeout=1200)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="an H3 model folder (python -m models synth DIR --profile demo)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[64], help="LoRA ranks (default: 64)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each case, interleaved (default: 3)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    root = args.model.resolve()
    for shard in (root / "transformer").glob("*.safetensors"):  # warm the page cache: every case reads it warm
        shard.read_bytes()
    rows = []
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        for rank in args.ranks:
            folder = Path(tmp) / "loras"
            folder.mkdir(exist_ok=True)
            lora = write_lora(root, folder / f"rank{rank}.safetensors", rank)
            runs: dict[str, list[dict]] = {case: [] for case in CASES}
            for _ in range(args.repeat):
                for case in CASES:
                    runs[case].append(run_case(case, root, lora))
            med = {case: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for case, rs in runs.items()}
            placed = med["plain"]["placed"]
            rows.append({
                "rank": rank, "lora_file_bytes": lora.stat().st_size, "dit_bytes": placed,
                "factor_bytes": med["merged"]["factor_bytes"], "held_peak_bytes": med["merged"]["held_peak_bytes"],
                **{f"{c}_seconds": med[c]["seconds"] for c in CASES},
                **{f"{c}_peak_ratio": med[c]["peak_bytes"] / placed for c in CASES if c != "floor"},
                "merged_prep_seconds": med["merged"]["prep_seconds"],
                "merged_group_seconds": med["merged"]["group_seconds"],
                "merged_merge_seconds": med["merged"]["merge_seconds"],
                "peft_import_seconds": med["merged"]["import_seconds"],
            })
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{root.name} DiT, bf16, CPU, medians of {args.repeat} interleaved runs each in a fresh process")
    print(f"{'rank':>5}{'LoRA MiB':>10}{'DiT MiB':>9}{'plain s':>9}{'merged s':>10}{'ratio':>8}{'floor s':>9}"
          f"{'(plain+floor)/plain':>21}{'groups s':>10}{'merge s':>9}{'prep s':>8}{'diffusers s':>13}"
          f"{'plain peak':>12}{'merged peak':>13}{'ratio':>7}{'diffusers peak':>16}{'held MiB':>10}")
    for r in rows:
        plain = r["plain_seconds"]
        print(f"{r['rank']:>5}{r['lora_file_bytes'] / 2**20:>10.1f}{r['dit_bytes'] / 2**20:>9.1f}"
              f"{plain:>9.2f}{r['merged_seconds']:>10.2f}{r['merged_seconds'] / plain:>7.2f}x"
              f"{r['floor_seconds']:>9.2f}{(plain + r['floor_seconds']) / plain:>20.2f}x"
              f"{r['merged_group_seconds']:>10.2f}{r['merged_merge_seconds']:>9.2f}{r['merged_prep_seconds']:>8.2f}"
              f"{r['diffusers_seconds']:>13.2f}{r['plain_peak_ratio']:>11.2f}x{r['merged_peak_ratio']:>12.2f}x"
              f"{r['merged_peak_ratio'] / r['plain_peak_ratio']:>6.2f}x{r['diffusers_peak_ratio']:>15.2f}x"
              f"{r['held_peak_bytes'] / 2**20:>10.2f}")
    print("floor: the same merges alone, on weights and factors already in memory (no read, no conversion): a merged"
          " load cannot beat plain + floor")
    print("peft's import, once per LoRA job and outside the clock above: "
          + ", ".join(f"{r['peft_import_seconds']:.1f} s" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

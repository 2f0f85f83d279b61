"""Reading a stored job spec (jobs.spec.JobSpec as a dict) for display.

`job_parameters` is the one list of a job's parameters as the pages show them:
the Job page's table, History's columns and Compare's Diff only all read it, so
a parameter shown in one place reads the same in the others.
"""

from __future__ import annotations

from pathlib import Path

from core.echo import echo
from models.speed.levers import lever_option, levers_of

from dashboard import format as fmt
from dashboard import words


def spec_of(job: dict) -> dict:
    return job.get("spec") or {}


def spec_mode(job: dict) -> str | None:
    return spec_of(job).get("mode")


def spec_checkpoint_name(job: dict) -> str:
    """`demo` or `demo/transformer`: the checkpoint folder name and component."""
    spec = spec_of(job)
    if not spec.get("model"):
        return fmt.MISSING
    name = Path(spec["model"]).name
    return f"{name}/{spec['component']}" if spec.get("component") else name


def checkpoint_key(job: dict) -> tuple[str | None, str | None, str]:
    """(model path, component, kind): jobs with equal keys measured the same thing,
    so their figures may be set against each other."""
    spec = spec_of(job)
    return spec.get("model"), spec.get("component"), job.get("kind", "load")


def job_label(job: dict) -> str:
    """Short unique label for legends: `#7 drain` for a load, `#8 t2va drain` (its workflow) for a generate."""
    if job.get("kind") == "generate":
        return f"#{job['id']} {workflow_of(spec_of(job).get('generate') or {})} {spec_mode(job) or ''}".strip()
    kind = "" if job.get("kind") == "load" else f" {job.get('kind')}"
    return f"#{job['id']} {spec_mode(job) or ''}{kind}".strip()


def _size_or_none(value: object) -> str:
    return fmt.gib(value, 2) if isinstance(value, (int, float)) and not isinstance(value, bool) else "none"


def job_parameters(job: dict) -> dict[str, str]:
    """Every parameter the job ran with, as readable strings in a fixed order:
    checkpoint and placement first, then limits, then (generate jobs) what was asked for.
    Offload flags read `on`/`off` as requested; the policy may have changed them (see the job's decisions)."""
    spec = spec_of(job)
    rows: dict[str, str] = {
        "kind": str(job.get("kind") or spec.get("kind") or fmt.MISSING),
        "checkpoint": spec.get("model") or fmt.MISSING,
        "component": spec.get("component") or ("all" if job.get("kind") == "generate" else "default (transformer)"),
        "mode": spec.get("mode") or fmt.MISSING,
        "device": str(spec.get("device") or fmt.MISSING),
        "dtype": spec.get("dtype") or "checkpoint dtype",
        "GPUs": str(spec.get("gpus", 1)),
        "memory limit": _size_or_none(spec.get("memory_limit")),
        "memory budget": _size_or_none(spec.get("memory_budget")),
        "memory floor": _size_or_none(spec.get("memory_floor")),
    }
    if "drop_page_cache" in spec:
        rows["drop page cache"] = fmt.flag(spec.get("drop_page_cache"))
    if job.get("kind", spec.get("kind")) == "load":
        rows["module built from"] = ("the checkpoint's own names and shapes (skeleton)" if spec.get("skeleton")
                                     else "its config's class (names and shapes checked)")
    if "sequential_components" in spec:
        rows["sequential components"] = fmt.flag(spec.get("sequential_components"))
    if str(spec.get("device") or "cpu") == "cpu" and spec.get("offload") is not None:
        rows["offload"] = "does not apply: everything runs on the CPU"
    else:
        for name, value in (spec.get("offload") or {}).items():
            rows[words.flag(name)] = fmt.flag(value)
    staging = (job.get("metrics") or {}).get("ring_staging")
    if staging:
        note = (job.get("metrics") or {}).get("ring_staging_note")
        rows["host staging (ran)"] = STAGING_WORDS.get(staging, staging) + (f": {note}" if note else "")
    rows.update(generate_parameters(job))
    return rows


STAGING_WORDS = {
    "registered": "pinned host memory (registered with the driver)",
    "torch-pinned": "pinned host memory from torch's allocator (registration refused, as on a GB10)",
    "pageable": "pageable host memory (slow: pinning was refused)",
}
"""How the ring's staging buffers were held, in the user's words (`LoadReport.ring_staging`)."""


def generate_parameters(job: dict) -> dict[str, str]:
    """What a generate job was asked for (prompt, seed, frames, size, steps, audio, workflow and its input images,
    the VAE and DiT knobs); {} for a load. The negative prompt and guidance are fixed by the model (H3 takes
    neither), so they are not listed. A spec from before a knob existed ran with its default, which is shown."""
    params = spec_of(job).get("generate")
    if not params:
        return {}
    frames, fps = params.get("frames"), params.get("fps")
    length = f" ({fmt.duration(frames / fps)} at {fps} fps)" if frames and fps else ""
    given = [field for field in words.INPUT_WORDS if params.get(field)]
    quantize = params.get("quantize")
    return {
        "prompt": params.get("prompt") or "",
        "seed": str(params.get("seed", fmt.MISSING)),
        "frames": f"{frames}{length}" if frames else fmt.MISSING,
        "size": f"{params.get('width')} × {params.get('height')} px" if params.get("width") and params.get("height") else "checkpoint default",
        "steps": (words.steps(params.get("steps")) if params.get("steps") else fmt.MISSING) + stated_by(job, "steps"),
        "shift": (f"{params['shift']:g}" if params.get("shift") is not None else "the scheduler config's")
                 + stated_by(job, "shift"),
        "audio": fmt.flag(params.get("audio")),
        "workflow": workflow_of(params),
        "input images": ", ".join(words.input_role(field) for field in given) or "none (text only)",
        "reference clip": Path(params["ref_video"]).name if params.get("ref_video") else "none",
        "VAE tiling": fmt.flag(params.get("vae_tiling", True)),
        "VAE precision": params.get("vae_dtype") or "bf16",
        "transformer weights": lever_option("quantize", quantize).label if quantize else "not quantized",
        "speed levers": lever_words(params),
        "plan": plan_words(spec_of(job)),
        "LoRAs": lora_words(params.get("loras") or []),
        "GPUs": parallel_words(params.get("parallel", 1)),
    }


def stated_by(job: dict, name: str) -> str:
    """` (stated by LoRA <file>)` where a LoRA's metadata gave the job its steps or shift; "" otherwise."""
    source = (spec_of(job).get("schedule") or {}).get(name) or ""
    return f" (stated by LoRA {echo(source[5:])})" if source.startswith("LoRA ") else ""


def parallel_words(ranks: int) -> str:
    """How many ranks one clip ran on (`--parallel`)."""
    if ranks == 1:
        return "1 (one process)"
    return f"{ranks} ranks, one GPU each (diffusers' context parallelism; text encoder and VAEs on rank 0)"


def plan_words(spec: dict) -> str:
    """What `--plan` chose and why, or "none" for a job queued without a plan."""
    planned = spec.get("planned")
    if not spec.get("plan") or not planned:
        return "none"
    chosen = planned.get("chosen")
    picked = planned["candidates"][chosen]["label"] if chosen is not None else "nothing fit; ran as asked"
    return f"{spec['plan']}: {picked} ({planned.get('why', '')})"


def lora_words(loras: list) -> str:
    """Each LoRA as `name x scale into partition (sha256 12 hex)`, in merge order; `none`. File names are user
    input: quoted bounded (`core.echo`)."""
    from core.echo import echo

    parts = []
    for lora in loras:
        if not isinstance(lora, dict):
            parts.append(echo(lora))
            continue
        digest = lora.get("sha256")
        parts.append(f"{echo(Path(str(lora.get('file', ''))).name)} x {lora.get('scale', 1.0):g}"
                     f" into {lora.get('partition') or 'the workflow transformer'}"
                     + (f" (sha256 {str(digest)[:12]})" if digest else ""))
    return "; ".join(parts) or "none"


def lever_words(params: dict) -> str:
    """The speed levers a generate spec asked for, each said lossless or lossy; "none" for the default engine
    (a spec from before levers existed ran with none)."""
    options = [o for o in levers_of(params) if o.field != "quantize"]
    return ", ".join(f"{o.label} ({'lossless' if o.lossless else 'lossy'})" for o in options) or "none"


def workflow_of(params: dict) -> str:
    """The workflow a generate spec ran: the one it names, else the one its images select (GenerateParams' rule)."""
    from models.request.params import GenerateParams

    try:
        return GenerateParams(**params).resolved_workflow
    except TypeError:  # a spec with fields this version does not know
        return params.get("workflow") or "t2va"


def field_errors(errors: list[str]) -> dict[str, list[str]]:
    """JobSpecError.errors ("field: message") grouped by field, so each shows beside its widget."""
    grouped: dict[str, list[str]] = {}
    for error in errors:
        name, _, message = error.partition(": ")
        grouped.setdefault(name, []).append(message or name)
    return grouped

"""Reading a stored job spec (jobs.spec.JobSpec as a dict) for display."""

from __future__ import annotations

from pathlib import Path

from dashboard import format as fmt


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


def job_label(job: dict) -> str:
    """Short unique label for legends: `#7 drain` (plus `gen` for generate jobs)."""
    kind = "" if job.get("kind") == "load" else f" {job.get('kind')}"
    return f"#{job['id']} {spec_mode(job) or ''}{kind}".strip()


def field_errors(errors: list[str]) -> dict[str, list[str]]:
    """JobSpecError.errors ("field: message") grouped by field, so each shows beside its widget."""
    grouped: dict[str, list[str]] = {}
    for error in errors:
        name, _, message = error.partition(": ")
        grouped.setdefault(name, []).append(message or name)
    return grouped

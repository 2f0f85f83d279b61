"""The job spec's error type, torch-free: the jobs CLI and listing jobs need it without the spec's loader imports."""

from __future__ import annotations

from core.errors import DrainboardError


class JobSpecError(DrainboardError):
    """A job spec is invalid; nothing was queued. `field` names the first bad field,
    `errors` lists every problem as "field: message"."""

    def __init__(self, field: str, message: str, errors: list[str] | None = None):
        self.field = field
        self.errors = errors or [f"{field}: {message}"]
        text = self.errors[0] if len(self.errors) == 1 else f"{len(self.errors)} problems: " + "; ".join(self.errors)
        super().__init__(text)

    def messages(self) -> list[str]:
        return list(self.errors)

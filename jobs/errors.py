"""The job spec's error type and the list a check files problems in, torch-free: the jobs CLI, listing jobs and
the job kinds' own checks need them without the spec's loader imports."""

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


class Problems:
    """Every problem found in one spec, in the order the fields are checked: what `build_spec` and each job kind's
    `check` add to, raised at once as one `JobSpecError`."""

    def __init__(self) -> None:
        self.found: list[tuple[str, str]] = []
        """(field, message) pairs."""

    def add(self, name: str, message: str) -> None:
        self.found.append((name, message))

    def has(self, *names: str) -> bool:
        """Whether a problem was filed under any of `names`."""
        return any(name in names for name, _ in self.found)

    def raise_any(self) -> None:
        if self.found:
            name, message = self.found[0]
            raise JobSpecError(name, message, [f"{n}: {m}" for n, m in self.found])

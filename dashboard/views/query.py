"""Job ids from query parameters: whatever a URL carries, a page gets ids or one clear message.

`str.isdigit` accepts superscripts ("²") that `int` refuses, SQLite's
integers stop at 2**63 - 1, and Python refuses to read integers of more than
4,300 digits: an id is at most `MAX_ID_DIGITS` ASCII digits, read only then,
and a bad value is quoted back bounded (`core.echo`).
"""

from __future__ import annotations

import re

from core.echo import echo

MAX_JOB_ID = 2**63 - 1
"""The largest integer SQLite stores (a job id above it cannot exist)."""
MAX_ID_DIGITS = len(str(MAX_JOB_ID))
"""19: the most digits a job id has; a longer text is refused before it is read as a number."""

MAX_NAMED = 3
"""The most bad parts of one `?jobs=` a message quotes."""

_ID = re.compile(r"[0-9]+")


class QueryError(ValueError):
    """A query parameter is not what the page accepts; the message says what was expected."""


def job_id(raw: str, *, name: str = "job") -> int:
    """A job id from `?job=...`: ASCII digits, 1 to 2**63 - 1."""
    text = raw.strip()
    if not _ID.fullmatch(text):
        raise QueryError(f"?{name}={echo(raw)} is not a job id: expected a whole number such as ?{name}=3")
    value = int(text.lstrip("0") or "0") if len(text.lstrip("0")) <= MAX_ID_DIGITS else MAX_JOB_ID + 1
    if not 1 <= value <= MAX_JOB_ID:
        raise QueryError(f"?{name}={echo(raw)} is not a job id: job ids run from 1 to {MAX_JOB_ID}")
    return value


def job_ids(raw: str, *, name: str = "jobs") -> list[int]:
    """Job ids from `?jobs=3,5,7`, in order, duplicates dropped; every bad part named at once."""
    ids: list[int] = []
    problems: list[str] = []
    for part in (p for p in raw.split(",") if p.strip()):
        try:
            value = job_id(part, name=name)
        except QueryError:
            problems.append(echo(part.strip()))
            continue
        if value not in ids:
            ids.append(value)
    if problems:
        what = "is not a job id" if len(problems) == 1 else "are not job ids"
        shown = ", ".join(problems[:MAX_NAMED]) + (f" and {len(problems) - MAX_NAMED} more" if len(problems) > MAX_NAMED else "")
        raise QueryError(f"?{name}=: {shown} {what}; expected whole numbers separated by commas, such as ?{name}=3,5")
    return ids

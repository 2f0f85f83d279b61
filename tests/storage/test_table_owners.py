"""Every table has one writer: no source file (product, bench or test) but its owning module writes a table with
SQL or sqlite-utils' table API, and every table the schema creates has an owner. The owners' own behaviour is
tested beside them (test_jobs_table.py, test_sample_writer.py, test_artifacts.py, ...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from storage.schema import open_database

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {
    "jobs": "storage/jobs_table.py",
    "samples": "storage/sample_writer.py",
    "sample_extremes": "storage/sample_writer.py",
    "events": "storage/events_table.py",
    "artifacts": "storage/artifacts.py",
    "supervisors": "storage/supervisors_table.py",
}
"""Table -> the one module that writes it; every other module calls its functions."""
SHAPERS = ("storage/schema.py", "tests/storage/test_schema.py")
"""Files that may write any table besides its owner: the schema (its definition and append-only migrations, which
backfill), and the schema's test, which builds old databases by hand to migrate them."""
SKIPPED_DIRS = {"node_modules", "site-packages", "_artifacts"}
"""Besides hidden folders (.git, a CI virtualenv): folders of files that are not this project's source."""
WRITE = re.compile(
    r"""\b(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|REPLACE\s+INTO|UPDATE(?:\s+OR\s+\w+)?|DELETE\s+FROM)\s+["'`]?(?P<sql>\w+)"""
    r"""|\[\s*["'](?P<api>\w+)["']\s*\]\s*\.\s*(?:insert|upsert|update|delete|insert_all|upsert_all|delete_where"""
    r"""|transform|add_column|drop)\b"""
    r"""|\.table\(\s*["'](?P<table>\w+)["']""",
    re.IGNORECASE,
)
"""A write to a named table: INSERT / REPLACE / UPDATE / DELETE in SQL, or sqlite-utils' table API."""


def _sources() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if not any(part in SKIPPED_DIRS or part.startswith(".")
                                                     for part in p.relative_to(ROOT).parts[:-1])]


def _written(text: str) -> list[tuple[str, int, str]]:
    """(table, line, the matched text) of each write to a table of the schema in `text`."""
    found = []
    for m in WRITE.finditer(text):
        table = (m.group("sql") or m.group("api") or m.group("table")).lower()
        if table in OWNERS:
            found.append((table, text.count("\n", 0, m.start()) + 1, m.group(0)))
    return found


def test_every_table_of_the_schema_has_one_owner(tmp_path: Path):
    db = open_database(tmp_path / "d.db")
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                       " AND name NOT LIKE 'sqlite_%'")}
    assert tables == set(OWNERS)
    assert all((ROOT / owner).is_file() for owner in OWNERS.values())


def test_no_module_but_a_table_s_owner_writes_it():
    here = Path(__file__).resolve()
    offenders = []
    for path in _sources():
        name = path.relative_to(ROOT).as_posix()
        if path.resolve() == here or name in SHAPERS:
            continue
        offenders += [f"{name}:{line}: {text!r} (write {table} through {OWNERS[table]})"
                      for table, line, text in _written(path.read_text(errors="replace")) if OWNERS[table] != name]
    assert offenders == [], "a table written outside its owner:\n" + "\n".join(offenders)


@pytest.mark.parametrize("line, table", [
    ('db.execute("UPDATE jobs SET stage = ? WHERE id = ?", [s, i])', "jobs"),
    ("conn.execute(\"INSERT INTO jobs (kind, spec, created_at) VALUES ('load', '{}', 0)\")", "jobs"),
    ('conn.execute("DELETE FROM samples WHERE job_id = ?", [i])', "samples"),
    ('db["events"].insert({"kind": "load"})', "events"),
    ("db.table('supervisors').upsert(row)", "supervisors"),
    ('db.execute("""\n    update   supervisors set pid = ?""")', "supervisors"),
    ('conn.execute("INSERT OR REPLACE INTO artifacts (job_id) VALUES (?)", [i])', "artifacts"),
    ('conn.executemany("REPLACE INTO sample_extremes VALUES (?)", rows)', "sample_extremes"),
    ("self.db['samples'].insert_all(rows)", "samples"),
])
def test_the_scan_sees_every_way_of_writing_a_table(line: str, table: str):
    assert [t for t, _, _ in _written(line)] == [table]


@pytest.mark.parametrize("line", [
    'db.query("SELECT * FROM events WHERE job_id = ?", [i])',
    'at.query_params["jobs"] = "1,2"',
    'conn.execute("UPDATE jobs_archive SET x = 1")',
    '"""Update the table of samples_seen."""',
    'events["kind"] == "stage_start"',
])
def test_the_scan_leaves_reads_other_tables_and_prose_alone(line: str):
    assert _written(line) == []


def test_each_owner_is_where_its_table_s_writes_are():
    written = {}
    for table, owner in OWNERS.items():
        written[table] = [t for t, _, _ in _written((ROOT / owner).read_text()) if t == table]
    assert all(written.values()), {t: w for t, w in written.items() if not w}

"""A generate job's schedule: `--shift` at submit, recorded on the job; a bad shift refused before queueing."""

from __future__ import annotations

import json

import pytest

from jobs.cli import main
from jobs.spec import JobSpecError, build_spec
from storage.queries import list_jobs

pytestmark = pytest.mark.usefixtures("launched_workers")  # submits here start no real worker


def _submit(tiny_model, capsys, *extra: str) -> dict:
    code = main(["submit", "generate", "--model", str(tiny_model), "--prompt", "a fox", "--steps", "3", *extra,
                 "--json"])
    body = json.loads(capsys.readouterr().out)
    assert code == 0, body
    return body


def test_submit_shift_is_recorded_on_the_job(db, config, capsys, tiny_model):
    _submit(tiny_model, capsys, "--shift", "5")
    [job] = list_jobs(db)
    assert job["spec"]["generate"]["shift"] == 5.0


@pytest.mark.parametrize("shift, message", [(0, "outside (0, 1000]"), ("fast", "must be a number"),
                                            (float("nan"), "must be a finite number")])
def test_a_bad_shift_is_refused_before_queueing(config, tiny_model, shift, message):
    with pytest.raises(JobSpecError) as caught:
        build_spec({"kind": "generate", "model": str(tiny_model), "generate": {"prompt": "a fox", "shift": shift}},
                   config)
    assert caught.value.field == "generate.shift" and message in str(caught.value)

"""A kill report quotes where the job really was: every sample up to the kill is in the database."""

import os
import random
import re
import signal
import time

import pytest

from storage.queries import get_job, sample_count


@pytest.mark.slow
def test_sigkill_at_20_random_points_quotes_a_sample_within_one_step_of_the_childs_progress(
    db, config, queue_job, tick_until, run_to_end, monkeypatch, tmp_path
):
    monkeypatch.setenv("DRAINBOARD_TEST_STEPS", "100000")
    monkeypatch.setenv("DRAINBOARD_TEST_DELAY", "0.002")
    rng = random.Random(13)
    for attempt in range(20):
        truth = tmp_path / f"truth-{attempt}"
        monkeypatch.setenv("DRAINBOARD_TEST_TRUTH", str(truth))
        job_id = queue_job("steps")
        tick_until(lambda: sample_count(db, job_id) >= 1)
        deadline = time.time() + rng.uniform(0.0, 1.5)  # somewhere in the first few hundred steps
        while time.time() < deadline:
            tick_until(lambda: True)
            time.sleep(0.01)
        os.kill(get_job(db, job_id)["pid"], signal.SIGKILL)
        job = run_to_end(job_id)
        reached = int(truth.read_text())
        quoted = int(re.search(r"tensor (\d+) of 100000 \(blocks\.\1\.weight\)", job["error"]).group(1))
        assert job["status"] == "killed" and "last sample at" in job["error"]
        assert 0 <= reached - quoted <= 1, (attempt, reached, quoted, job["error"])
        assert sample_count(db, job_id) == quoted  # samples 1..quoted all stored, none lost with the child


def test_a_sigbus_says_the_file_most_likely_changed_while_it_was_read(queue_job, run_to_end):
    job = run_to_end(queue_job("shrinking_file"))
    assert job["status"] == "killed" and job["signal"] == "SIGBUS"
    assert job["error"].startswith("killed by SIGBUS: most likely a checkpoint file changed or shrank while it was "
                                   "being read")

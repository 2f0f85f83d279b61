import inspect

import pytest

from jobs.kinds import get_kind, job_kind, kind_names


def test_the_built_in_kinds_are_listed_documented_and_found_by_name(monkeypatch):
    monkeypatch.delenv("DRAINBOARD_PLUGINS", raising=False)
    assert {"generate", "load"} <= set(kind_names())
    for name in ("generate", "load"):
        run = get_kind(name).run
        assert run.__module__ == f"jobs.kinds.{name}"
        assert inspect.getdoc(run), f"job kind {name!r} has no docstring"
        assert list(inspect.signature(run).parameters) == ["spec", "ctx"]


def test_a_module_named_in_the_environment_adds_its_kinds(monkeypatch):
    monkeypatch.setenv("DRAINBOARD_PLUGINS", " tests.jobs.kinds_for_tests , ")
    assert {"steps", "fail", "allocate"} <= set(kind_names())
    assert get_kind("steps").run.__module__ == "tests.jobs.kinds_for_tests"


def test_an_unknown_kind_names_the_known_ones_and_a_name_cannot_be_registered_twice(monkeypatch):
    monkeypatch.setenv("DRAINBOARD_PLUGINS", "tests.jobs.kinds_for_tests")
    with pytest.raises(KeyError, match=r"unknown job kind 'lod'; known: .*generate, load"):
        get_kind("lod")

    def other(spec, ctx):
        """Not the load kind."""

    with pytest.raises(ValueError, match="job kind 'load' is already registered by jobs.kinds.load"):
        job_kind("load")(other)
    assert job_kind("load")(get_kind("load")) is get_kind("load")  # the same kind again is harmless
    assert job_kind("steps")(get_kind("steps").run) is get_kind("steps").run  # and the same function


def test_an_installed_torchaos_import_warnings_stay_out_of_the_jobs_log(db, config, queue_job, run_to_end):
    """torchao prints "Failed to load ... Could not load this library" for kernels built for another torch when
    diffusers imports it; a job child's log starts with the job's own lines instead."""
    import importlib.util

    from storage.artifacts import job_dir

    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed (requirements-quant.txt): nothing imports it")
    job = run_to_end(queue_job("diffusers_import"))
    assert job["status"] == "succeeded", job["error"]
    log = (job_dir(config.data_dir, job["id"]) / "child.log").read_text()
    assert "Could not load this library" not in log and "Unable to import `torchao`" not in log, log

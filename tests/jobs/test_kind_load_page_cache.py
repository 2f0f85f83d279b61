"""The spec's `drop_page_cache` reaches the loader of a load job (and is refused where nothing would apply it)."""

import pytest

from tests.jobs.test_kind_load import small_checkpoint  # noqa: F401 (fixture)


@pytest.mark.parametrize("drop, dropped", [(True, True), (False, False), (None, False)])
def test_a_load_job_drops_the_page_cache_as_its_spec_says(queue_job, run_to_end, small_checkpoint, drop, dropped):  # noqa: F811
    job = run_to_end(queue_job("load", model=str(small_checkpoint), component="transformer", drop_page_cache=drop))
    assert job["status"] == "succeeded", job["error"]
    assert job["metrics"]["page_cache_dropped"] is dropped  # None: the CPU default keeps the cache

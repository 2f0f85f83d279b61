"""A Run page rerun (every widget change is one) discovers nothing again while the checkpoint's files are
unchanged, even once the page's own 10 s caches have expired; a changed file is discovered anew. Counted by
the loader's discovery calls, not timed (bench/bench_discovery.py has the 200,000-tensor figures)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import streamlit as st
from streamlit.testing.v1 import AppTest

from loader import checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_a_rerun_discovers_nothing_until_the_files_change(fresh_db, tiny_checkpoint, monkeypatch):
    past = time.time_ns() - 60 * 10**9  # a checkpoint written a minute ago (a fresher one is not remembered yet)
    os.utime(tiny_checkpoint, ns=(past, past))
    calls = []
    real = checkpoint.discover_checkpoint
    monkeypatch.setattr(checkpoint, "discover_checkpoint", lambda path, **kw: calls.append(path) or real(path, **kw))
    at = AppTest.from_file(str(ROOT / "dashboard" / "pages" / "run.py"), default_timeout=60).run()
    assert not at.exception, at.exception
    assert calls, "the page never asked the loader about the checkpoint"
    first = len(calls)

    st.cache_data.clear()  # what the picker's and the forecast's time-to-live do every 10 s
    at.run()
    assert not at.exception, at.exception
    assert len(calls) == first  # the listing, the submit check and the forecast: all remembered

    stat = tiny_checkpoint.stat()
    os.utime(tiny_checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    st.cache_data.clear()
    at.run()
    assert len(calls) > first

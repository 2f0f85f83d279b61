"""Fixtures for dashboard tests: sample frames shaped like storage rows."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

import models.request.params  # noqa: F401  (before a page runs: AppTest puts dashboard/pages, and its models.py, on sys.path)

GIB = 2**30


@pytest.fixture(autouse=True)
def _restore_main_module():
    """AppTest runs a page as `__main__` and leaves it there; a later test that starts
    processes with `spawn` would then re-run that page in every child. Put it back."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


def make_samples(n: int = 120, *, ranks: int = 1, gpu: bool = False) -> pd.DataFrame:
    """A load of 2 GiB in `n` samples: VmRSS climbs by what is placed,
    RssFile by a quarter of it, MemAvailable falls by the same amount;
    the last fifth of the samples are a 'denoising' stage after placement."""
    frames = []
    for rank in range(ranks):
        i = np.arange(n)
        load_n = n * 4 // 5
        placed = np.minimum(i + 1, load_n) * (2 * GIB // load_n)
        frames.append(
            pd.DataFrame(
                {
                    "job_id": 1,
                    "seq": i,
                    "rank": rank,
                    "t": i * 0.1,
                    "stage": ["load"] * load_n + ["denoising"] * (n - load_n),
                    "tensors_placed": np.minimum(i + 1, load_n),
                    "bytes_placed": placed,
                    "tensor_name": [f"transformer_blocks.{k}.attn.to_q.weight" for k in i],
                    "vm_rss": GIB // 4 + placed + rank * GIB // 8,
                    "rss_anon": GIB // 4 + placed * 3 // 4,
                    "rss_file": placed // 4,
                    "vm_hwm": GIB // 4 + placed,
                    "mem_available": 20 * GIB - placed,
                    "device_allocated": placed if gpu else 0,
                    "device_reserved": placed if gpu else 0,
                    "cgroup_usage": None,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


@pytest.fixture
def sample_frame():
    """The make_samples factory, for tests that need other shapes (ranks, GPU, length)."""
    return make_samples


@pytest.fixture
def load_samples() -> pd.DataFrame:
    """120 samples of one rank loading 2 GiB on CPU, then a denoising stage."""
    return make_samples()


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    """An empty Drainboard data folder (with a models root inside) that the pages read through the environment."""
    import streamlit as st

    folder = tmp_path / "data"
    (folder / "models").mkdir(parents=True)
    monkeypatch.setenv("DRAINBOARD_DATA", str(folder))
    monkeypatch.setenv("DRAINBOARD_MODEL_ROOTS", str(folder / "models"))
    monkeypatch.delenv("DRAINBOARD_CONFIG", raising=False)
    st.cache_data.clear()
    yield folder
    st.cache_data.clear()


@pytest.fixture
def fresh_db(data_dir):
    """A connection to the schema-ready, empty database in `data_dir`."""
    from storage.schema import open_database

    db = open_database(data_dir / "drainboard.db")
    yield db
    db.conn.close()


@pytest.fixture
def tiny_checkpoint(data_dir):
    """A one-file checkpoint under the model root: three small random tensors (about 200 KiB, float32)."""
    import torch
    from safetensors.torch import save_file

    path = data_dir / "models" / "tiny.safetensors"
    generator = torch.Generator().manual_seed(0)
    save_file(
        {
            "proj_in.weight": torch.randn(64, 96, generator=generator),
            "transformer_blocks.0.attn.to_q.weight": torch.randn(128, 128, generator=generator),
            "transformer_blocks.0.ff.fc_in.weight": torch.randn(256, 128, generator=generator),
        },
        str(path),
    )
    return path


def add_job(db, *, status: str, mode: str = "stream", model: str = "/models/tiny", samples: pd.DataFrame | None = None,
            metrics: dict | None = None, kind: str = "load", signal: str | None = None, error: str | None = None,
            generate: dict | None = None, retry_of: int | None = None, memory_limit: int | None = None,
            started_at: float | None = None) -> int:
    """Add a job as if it had run, through the table's own transitions: queued 30 s ago, started 25 s ago (or
    at `started_at`), ended 5 s ago unless `status` says it has not; then its samples."""
    import time

    from jobs.spec import JobSpec
    from models.request.params import GenerateParams
    from storage import jobs_table
    from storage.schema import FINAL_STATUSES

    spec = JobSpec.from_dict({"kind": kind, "model": model, "mode": mode, "memory_limit": memory_limit,
                              "generate": GenerateParams(**generate) if generate else None})
    now = time.time()
    job_id = jobs_table.enqueue(db, kind, spec.to_dict(), retry_of=retry_of, now=now - 30)
    if status != "queued":
        jobs_table.start(db, job_id, supervisor_id="test", now=now - 25 if started_at is None else started_at)
    if status in FINAL_STATUSES:
        jobs_table.finish(db, job_id, status, error=error, signal=signal, metrics=metrics, now=now - 5)
    else:
        if metrics:
            jobs_table.set_metrics(db, job_id, metrics)
        if error:
            jobs_table.set_error(db, job_id, error, None)
    if samples is not None:
        _write_samples(db, job_id, samples)
    return job_id


def _write_samples(db, job_id: int, samples: pd.DataFrame) -> None:
    """Through the job child's own SampleWriter (it also keeps the extremes the series query reads)."""
    from pathlib import Path

    from machine.memory import MemorySample
    from storage.sample_writer import SampleWriter

    db_path = Path(db.execute("PRAGMA database_list").fetchone()[2])
    for rank, part in samples.groupby("rank"):
        with SampleWriter(db_path, job_id, t0=0.0, rank=int(rank)) as writer:
            for row in part.itertuples():
                writer.add(
                    MemorySample(
                        t=row.t, vm_rss=int(row.vm_rss), rss_anon=int(row.rss_anon), rss_file=int(row.rss_file),
                        vm_hwm=int(row.vm_hwm), mem_available=int(row.mem_available),
                        device_allocated=int(row.device_allocated), device_reserved=int(row.device_reserved),
                        cgroup_usage=None if pd.isna(row.cgroup_usage) else int(row.cgroup_usage),
                    ),
                    stage=row.stage, tensors_placed=int(row.tensors_placed), bytes_placed=int(row.bytes_placed),
                    tensor_name=row.tensor_name,
                )


@pytest.fixture
def job_adder():
    """The add_job helper: add_job(db, status=..., mode=..., samples=..., metrics=...) -> job id."""
    return add_job

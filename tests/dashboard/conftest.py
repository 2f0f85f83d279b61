"""Fixtures for dashboard tests: sample frames shaped like storage rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

GIB = 2**30


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

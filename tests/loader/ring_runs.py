"""Running the CUDA ring of `stream` on CPU destinations: its copy step is device-agnostic, so its chunking
and O_DIRECT reads are checked without a GPU (no pipeline package needed: the GPU host runs these too)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from loader.placement.ranges import RangeRing


def run_ring(files, pieces, *, chunk: int, read: int, threads: int = 3, reader: str = "auto"):
    """Read `pieces` (`chunks.Piece`) through a three-buffer ring over `files` (`OpenFiles`), which it closes:
    the ring's stats."""
    with ThreadPoolExecutor(threads) as pool:
        ring = RangeRing(torch.device("cpu"), pool, files, buffers=3, chunk_bytes=chunk, read_bytes=read, pin=False,
                         reader=reader, readers=threads)
        try:
            ring.run(pieces)
            ring.finish()
        finally:
            ring.release()
            files.close_all()
    return ring.stats

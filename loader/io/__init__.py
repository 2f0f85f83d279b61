"""The loader's I/O engine: io_uring reads, pinned host buffers, CUDA driver copies, page-cache
residency and drops, and positioned reads into tensors. The placements and the sharded loader use it;
outside the loader only benchmarks reach in (to time its parts)."""

"""Sharded loads: each rank of a 1-D device mesh reads only its own dim-0 slices (see docs/sharded.md).

`placement` (ShardedPlacement, the Shard(0) slicing), `report` (per-rank and
aggregate reports), `worker` (load_sharded, the torchrun entry
`python -m loader.sharded.worker`; not imported here, so running it as a
module finds it unloaded), `launch` (launch_sharded: N local ranks from a
parent process).
"""

from .launch import format_sharded, launch_sharded, run_sharded_cli
from .placement import ShardedPlacement, local_target, shard_rows, wrap_fully_shard
from .report import RankReport, ShardedPhases, ShardedReport

__all__ = [
    "RankReport",
    "ShardedPhases",
    "ShardedPlacement",
    "ShardedReport",
    "format_sharded",
    "launch_sharded",
    "local_target",
    "run_sharded_cli",
    "shard_rows",
    "wrap_fully_shard",
]

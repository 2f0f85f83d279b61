"""The report of a sharded load: every rank's LoadReport and their aggregate.

Each rank's ratios are measured against that rank's own share
(`bytes_placed` of its slices), so a rank that holds half the model at a
footprint of 1.0 holds exactly its half. The aggregate adds bytes, takes the
slowest rank's time and the worst rank's ratios.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..report import LoadReport


@dataclass
class ShardedPhases:
    """Where one rank's time went, in seconds (host clock; CUDA work is asynchronous until `sync`).

    `group` and `setup` come before the load and are not part of
    `load_seconds`; `allocate + read + assign + sync` make it up.
    """

    group: float = 0.0
    """Process group and device mesh start-up (NCCL or gloo), measured by the worker; 0 when not."""
    setup: float = 0.0
    """DTensor runtime warm-up, this rank's plan and `fully_shard` on the empty module."""
    allocate: float = 0.0
    """Allocating the destinations (this rank's slices) on the device."""
    read: float = 0.0
    """Reading this rank's bytes and issuing their copies to the device, waits for staging buffers included."""
    assign: float = 0.0
    """Wrapping each slice as a DTensor and handing it to its owner (FSDP's re-pad of short shards included)."""
    sync: float = 0.0
    """Waiting for the device to finish the last copies."""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RankReport:
    """One rank's load."""

    rank: int
    """Global rank."""
    device: str
    """Where its shards live (e.g. `cuda:1`)."""
    report: LoadReport
    """Its LoadReport; ratios against this rank's share."""
    share_bytes: int
    """Checkpoint bytes of this rank's slices (what it should read)."""
    phases: ShardedPhases = field(default_factory=ShardedPhases)
    """Its time by phase."""

    def to_dict(self) -> dict:
        """Flat: the LoadReport's metrics with rank fields and `phases`, without the per-tensor name list."""
        out = {"rank": self.rank, "share_bytes": self.share_bytes, **self.report.to_dict()}
        out.pop("loaded")
        out["device"] = self.device
        out["phases"] = self.phases.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "RankReport":
        fields_ = {k: v for k, v in data.items() if k not in ("rank", "share_bytes", "phases")}
        phases = ShardedPhases(**data.get("phases", {}))
        return cls(data["rank"], data["device"], LoadReport(**fields_), data["share_bytes"], phases)


@dataclass
class ShardedReport:
    """Aggregate of a sharded load over `world_size` ranks (the LoadReport metric names)."""

    world_size: int
    """Ranks that loaded."""
    checkpoint_bytes: int
    """Bytes of every planned tensor in the checkpoint (read once in total when sharding is exact)."""
    fsdp_units: int = 0
    """Modules wrapped with fully_shard (the root included); 0 without FSDP."""
    tensors_total: int = 0
    """Target tensors per rank (each rank places a shard of every one)."""
    bytes_placed: int = 0
    """Sum over ranks of bytes placed (each rank's shards)."""
    bytes_read: int = 0
    """Sum over ranks of checkpoint bytes read."""
    read_amplification: float = 0.0
    """bytes_read / checkpoint_bytes: 1.0 when every byte is read by exactly one rank."""
    load_seconds: float = 0.0
    """The slowest rank's load_seconds."""
    throughput_gbps: float = 0.0
    """bytes_read / load_seconds / 1e9 over all ranks."""
    footprint_ratio: float = 0.0
    """Largest per-rank footprint_ratio (each against its own share)."""
    host_peak_ratio: float = 0.0
    """Largest per-rank host_peak_ratio."""
    memavailable_cost_ratio: float = 0.0
    """Largest MemAvailable drop any rank saw / bytes_placed of all ranks (ranks on one host share it)."""
    peak_device_allocated_bytes: int = 0
    """Largest per-rank peak of torch.cuda.memory_allocated."""
    phases: ShardedPhases = field(default_factory=ShardedPhases)
    """Each phase's longest time over the ranks."""
    ranks: list[RankReport] = field(default_factory=list)
    """Per-rank reports in rank order."""

    @classmethod
    def aggregate(cls, ranks: list[RankReport], checkpoint_bytes: int, fsdp_units: int = 0) -> "ShardedReport":
        ranks = sorted(ranks, key=lambda r: r.rank)
        reports = [r.report for r in ranks]
        out = cls(world_size=len(ranks), checkpoint_bytes=checkpoint_bytes, fsdp_units=fsdp_units, ranks=ranks)
        out.tensors_total = max((r.tensors_total for r in reports), default=0)
        out.bytes_placed = sum(r.bytes_placed for r in reports)
        out.bytes_read = sum(r.bytes_read for r in reports)
        out.read_amplification = out.bytes_read / checkpoint_bytes if checkpoint_bytes else 0.0
        out.load_seconds = max((r.load_seconds for r in reports), default=0.0)
        out.throughput_gbps = out.bytes_read / out.load_seconds / 1e9 if out.load_seconds > 0 else 0.0
        out.footprint_ratio = max((r.footprint_ratio for r in reports), default=0.0)
        out.host_peak_ratio = max((r.host_peak_ratio for r in reports), default=0.0)
        drops = [r.memavailable_cost_ratio * r.bytes_placed for r in reports]
        out.memavailable_cost_ratio = max(drops, default=0.0) / out.bytes_placed if out.bytes_placed else 0.0
        out.peak_device_allocated_bytes = max((r.peak_device_allocated_bytes for r in reports), default=0)
        out.phases = ShardedPhases(
            **{k: max((r.phases.to_dict()[k] for r in ranks), default=0.0) for k in ShardedPhases().to_dict()}
        )
        return out

    def to_dict(self) -> dict:
        """`{"aggregate": {...}, "ranks": [...]}`: the shape `python -m loader load --nproc N --json` prints."""
        aggregate = asdict(self)
        aggregate.pop("ranks")
        aggregate["mode"] = "sharded"
        return {"aggregate": aggregate, "ranks": [r.to_dict() for r in self.ranks]}

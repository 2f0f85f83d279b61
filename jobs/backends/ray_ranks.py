"""A parallel generate's ranks under Ray: a placement group holds a GPU (or a CPU) per rank, on one node or spread.

A Ray job whose generate runs `--parallel N` (`ray_jobs.submission` sets `ENV_RANKS`) asks no GPUs for its driver:
its child starts the ranks through `RayRanks`, the `models.parallel.launch.RankLauncher` for a cluster.

- Placement, decided from what the cluster's alive nodes hold in all (not what is free now, so a busy node is waited
  for rather than a spread chosen by chance): one node that holds N bundles gets them all (`STRICT_PACK`: the GPUs'
  own links, the host walls as for local ranks); otherwise N nodes that hold one each get one each
  (`STRICT_SPREAD`: two DGX Sparks over their ConnectX-7 link); a cluster with neither is refused in one line before
  anything is reserved. A bundle is one GPU and one CPU (one CPU on a CPU run).
- Each bundle holds a `_RankHost` actor, which starts the rank on its node as the local launcher does
  (`models.parallel.launch.rank_command` with `rank_environment`: rank 0's node address, the one it joined the cluster
  with (`ray start --node-ip-address`), and a free port there as
  MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK among the ranks on that node, whose GPUs are its
  CUDA_VISIBLE_DEVICES), in a folder of its own on that node; the rank dies with the actor (PR_SET_PDEATHSIG).
- The parent polls each actor (`_RayRank`, which answers as a `subprocess.Popen` does): the new bytes of the rank's
  JSON lines, and once it ended its exit code, its error or result, and rank 0's MP4, all copied into the parent's
  folder, where `models.parallel.launch` follows them, names the first rank to die and stops the others as it does for
  local ranks. An actor that dies (its node lost) counts as its rank killed, saying so.
- `close` ends the actors and removes the placement group: nothing is left holding the GPUs. Ray would do both
  when the job's driver exits anyway (neither is detached).

Every node needs the checkout, the environment and the model at the same paths (the request names them as the
submitting machine resolved them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

from core.errors import DeviceError
from machine.lifetime import wait_polling

ENV_RANKS = "DRAINBOARD_RAY_RANKS"
"""Set ("1") in a Ray job whose generate runs several ranks: its child places them through Ray (`RayRanks`)."""
POLL_TIMEOUT = 30.0
"""Seconds one poll of a rank may take before it is asked again (a node busy loading weights answers late)."""
OUTPUT = "rank-0.mp4"
"""Rank 0's MP4 in its own folder, copied back to the job's artifact when the rank ended well."""


def placement(nodes: list[dict[str, float]], bundle: dict[str, float], world: int,
              prefer: str | None = None) -> str | None:
    """`STRICT_PACK` when one node (its total resources) holds `world` bundles, `STRICT_SPREAD` when `world` nodes
    hold one each, None when neither; `prefer` (the strategy the job was forecast with) wins where the nodes allow
    it."""
    def holds(node: dict[str, float]) -> int:
        return int(min(node.get(name, 0.0) // amount for name, amount in bundle.items()))

    counts = [holds(node) for node in nodes]
    allowed = [strategy for strategy, ok in (("STRICT_PACK", any(count >= world for count in counts)),
                                             ("STRICT_SPREAD", sum(count >= 1 for count in counts) >= world)) if ok]
    return prefer if prefer in allowed else next(iter(allowed), None)


def rank_bundle(device: str) -> dict[str, float]:
    """What one rank reserves: a GPU and a CPU on CUDA, a CPU on the CPU."""
    return {"GPU": 1.0, "CPU": 1.0} if device == "cuda" else {"CPU": 1.0}


def placement_problem(nodes: list[dict[str, float]], bundle: dict[str, float], world: int) -> str | None:
    """Why the cluster's `nodes` (their total resources) cannot place `world` ranks of `bundle`, in one line."""
    if placement(nodes, bundle, world) is not None:
        return None
    held = "; ".join(", ".join(f"{n.get(name, 0):g} {name}" for name in bundle) for n in nodes) or "no node"
    return (f"--parallel {world} under Ray needs {world} ranks of {_words(bundle)} on one node or one on each of"
            f" {world} nodes; the cluster's alive nodes hold: {held}")


def cluster_placement(address: str, device: str, world: int) -> tuple[str | None, str | None]:
    """How the cluster at `address` (its dashboard) would place `world` ranks on `device`, asked at submit:
    (`placement`'s strategy, None), or (None, `placement_problem`'s line), or (None, None) when it does not answer
    (the job then waits in the queue, and its child asks again)."""
    from jobs.backends.ray_state import cluster_nodes

    try:
        nodes = [{"GPU": n.gpus, "CPU": n.cpus} for n in cluster_nodes(address) if n.state == "ALIVE"]
    except Exception:  # noqa: BLE001 - no answer is not a refusal
        return None, None
    bundle = rank_bundle(device)
    return placement(nodes, bundle, world), placement_problem(nodes, bundle, world)


def local_ranks(nodes: list[str]) -> list[tuple[int, int]]:
    """(local rank, ranks on its node) of each rank, from the node each runs on, in rank order."""
    return [(nodes[:rank].count(node), nodes.count(node)) for rank, node in enumerate(nodes)]


class _RankHost:
    """The actor in one rank's bundle: starts the rank on its node and answers the parent's polls."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="drainboard-rank-"))
        self.proc: subprocess.Popen | None = None

    def where(self) -> dict:
        """Its node's id, the GPUs Ray gave this bundle, a free port (rank 0's is the rendezvous), its pid (the rank's
        parent)."""
        import ray

        from models.parallel.launch import free_port

        return {"node": ray.get_runtime_context().get_node_id(), "gpus": [str(g) for g in ray.get_gpu_ids()],
                "port": free_port(""), "pid": os.getpid()}

    def start(self, request: dict, rank: int, env: dict[str, str]) -> int:
        """Write the request into its folder and start the rank there; its pid."""
        from models.parallel.launch import rank_command

        (self.folder / "request.json").write_text(json.dumps(request))
        self.proc = subprocess.Popen(rank_command(self.folder, rank), stdout=2, env=env)
        return self.proc.pid

    def poll(self, rank: int, offset: int) -> dict:
        """The rank's exit code (None while it runs), its lines from `offset` on, and once it ended its error and
        result (written before it exited, so whole)."""
        code = self.proc.poll()
        lines = self.folder / f"rank-{rank}.jsonl"
        chunk = b""
        if lines.exists():
            with open(lines, "rb") as f:
                f.seek(offset)
                chunk = f.read()
        found = {"code": code, "lines": chunk}
        if code is not None:
            for name in ("error", "result"):
                path = self.folder / f"rank-{rank}.{name}.json"
                found[name] = path.read_text() if path.exists() else None
        return found

    def output(self) -> bytes:
        return (self.folder / OUTPUT).read_bytes()

    def signal(self, number: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(number)

    def close(self) -> None:
        """Kill the rank if it still runs, remove its folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class _RayRank:
    """One rank on a Ray node, answering as `subprocess.Popen` does; each poll copies what it wrote into `folder`."""

    def __init__(self, actor, rank: int, node_ip: str, folder: Path, out_path: Path | None):
        self._actor, self._rank, self._ip, self._folder, self._out = actor, rank, node_ip, folder, out_path
        self._offset = 0
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayError

        try:
            found = ray.get(self._actor.poll.remote(self._rank, self._offset), timeout=POLL_TIMEOUT)
        except GetTimeoutError:
            return None
        except RayError as e:  # its actor died (its node lost), or failed: the rank is gone with it
            how = "died" if isinstance(e, RayActorError) else "failed"
            self._write("error.json", json.dumps({"error": f"its Ray worker on {self._ip} {how}: "
                                                           f"{(str(e).splitlines() or [''])[0][:500]}"}))
            self.returncode = -signal.SIGKILL
            return self.returncode
        with open(self._folder / f"rank-{self._rank}.jsonl", "ab") as f:
            f.write(found["lines"])
        self._offset += len(found["lines"])
        if found["code"] is None:
            return None
        for name in ("error", "result"):
            if found[name] is not None:
                self._write(f"{name}.json", found[name])
        if found["code"] == 0 and self._out is not None:
            self._out.write_bytes(ray.get(self._actor.output.remote()))
        self.returncode = found["code"]
        return self.returncode

    def _write(self, name: str, text: str) -> None:
        (self._folder / f"rank-{self._rank}.{name}").write_text(text)

    def wait(self, timeout: float | None = None) -> int:
        return wait_polling(self.poll, timeout, f"rank {self._rank}", 0.1)

    def terminate(self) -> None:
        self._actor.signal.remote(signal.SIGTERM)

    def kill(self) -> None:
        """End its actor, and so the rank (it dies with it): done even where the node no longer answers."""
        import ray

        ray.kill(self._actor)


class RayRanks:
    """`models.parallel.launch.RankLauncher` on the Ray cluster this process's job runs on (`ray.init()` finds it)."""

    def __init__(self, on_note: Callable[[str, dict], None] | None = None, prefer: str | None = None,
                 wait_seconds: float = 1.0):
        self._on_note, self._prefer, self._wait = on_note, prefer, wait_seconds
        self._group = None
        self._actors: list = []
        self._started_ray = False
        self.strategy: str | None = None
        """The placement group's strategy once started: STRICT_PACK or STRICT_SPREAD."""

    def start(self, folder: Path, request: dict, world: int) -> list[_RayRank]:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from jobs.wire import ENV_NONCE
        from models.parallel.launch import rank_environment

        if not ray.is_initialized():
            ray.init(logging_level="WARNING")
            self._started_ray = True
        device = request["device"]
        bundle = rank_bundle(device)
        alive = [n for n in ray.nodes() if n["Alive"]]
        nodes = [n["Resources"] for n in alive]
        self.strategy = placement(nodes, bundle, world, self._prefer)
        if self.strategy is None:
            raise DeviceError(placement_problem(nodes, bundle, world))
        self._group = placement_group([bundle] * world, strategy=self.strategy, name=folder.name)
        if not self._group.wait(self._wait) and self._on_note is not None:
            self._on_note(f"waiting for Ray to place {world} ranks of {_words(bundle)} ({self.strategy})",
                          {"strategy": self.strategy})
        while not self._group.wait(self._wait):
            pass  # a cancel's SIGTERM lands between the waits
        host = ray.remote(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0), max_restarts=0)(_RankHost)
        self._actors = [host.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            self._group, placement_group_bundle_index=rank)).remote() for rank in range(world)]
        places = ray.get([a.where.remote() for a in self._actors])
        address = {n["NodeID"]: n["NodeManagerAddress"] for n in alive}  # as the node joined: its --node-ip-address
        for place in places:
            place["ip"] = address[place["node"]]
        if self._on_note is not None:
            where = ", ".join(f"rank {r} on {p['ip']} (node {p['node'][:8]})" for r, p in enumerate(places))
            self._on_note(f"ranks placed by Ray ({self.strategy}): {where}",
                            {"strategy": self.strategy, "nodes": [p["node"] for p in places],
                             "addresses": [p["ip"] for p in places]})
        locals_ = local_ranks([p["node"] for p in places])
        remote = {**request, "out_path": OUTPUT}
        # Not the job's nonce; on CUDA not Ray's OMP_NUM_THREADS=1 either (the bundle's one CPU is for a CPU rank's
        # compute; a GPU rank's host work, its load, takes the node's threads as a local rank does).
        dropped = {ENV_NONCE, "OMP_NUM_THREADS"} if device == "cuda" else {ENV_NONCE}
        base = {k: v for k, v in os.environ.items() if k not in dropped}
        ranks, started = [], []
        for rank, (actor, place, (local, count)) in enumerate(zip(self._actors, places, locals_)):
            env = rank_environment(base, rank=rank, world=world, local_rank=local, local_world=count,
                                   master=(places[0]["ip"], places[0]["port"]), device=device, parent=place["pid"])
            if device == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = ",".join(p["gpus"][0] for p in places if p["node"] == place["node"])
            ranks.append(_RayRank(actor, rank, place["ip"], folder,
                                  Path(request["out_path"]) if rank == 0 else None))
            started.append(actor.start.remote(remote, rank, env))
        ray.get(started)
        return ranks

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self._actors:
            try:
                ray.get(actor.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a lost actor has nothing left to close; it is killed below
                pass
            ray.kill(actor)
        if self._group is not None:
            remove_placement_group(self._group)
        self._actors, self._group = [], None
        if self._started_ray:
            ray.shutdown()


def _words(bundle: dict[str, float]) -> str:
    return " and ".join(f"{amount:g} {name}" for name, amount in bundle.items())

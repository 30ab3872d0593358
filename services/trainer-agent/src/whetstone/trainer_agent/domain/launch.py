"""The command line and environment of a segment's training process. Pure.

- one device and no DeepSpeed (a CPU node alone): ONE plain process, `python -m <recipe>`;
  inherited rank variables are removed so the trainer does not try to join a process group;
- several CPU nodes: `torchrun`, one worker per node, DDP over gloo (the deepspeed runner is not
  used on CPU nodes: their plan has no DeepSpeed);
- several GPUs, or DeepSpeed: `torchrun` (torch.distributed.run; the default) or the
  `deepspeed` runner, one launcher per node, with the rendezvous of the assignment:
  MASTER_ADDR/MASTER_PORT of node rank 0, WORLD_SIZE = nodes x GPUs per node, NODE_RANK.
  Each worker then gets RANK = NODE_RANK x GPUs per node + LOCAL_RANK from the launcher;
- GPUs are isolated with CUDA_VISIBLE_DEVICES (GPU nodes only): worker LOCAL_RANK i sees the
  assignment's i-th GPU as cuda:i. The deepspeed runner sets it per worker from `--include`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from whetstone.contracts import Rendezvous as AssignedRendezvous

from .distributed import DistributedConfigError, DistributedPlan

Launcher = Literal["process", "torchrun", "deepspeed"]

RANK_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "ROLE_RANK", "ROLE_WORLD_SIZE", "CROSS_RANK", "CROSS_SIZE", "TORCHELASTIC_RUN_ID",
)
PORT_BASE, PORT_SPAN = 29500, 2000
# the process group's timeout in seconds (the agent's collective_timeout_s), read by the recipe
COLLECTIVE_TIMEOUT_ENV = "WHETSTONE_COLLECTIVE_TIMEOUT_S"
# the node a rank runs on (its agent's node id), named by the recipe's gang checks
NODE_ID_ENV = "WHETSTONE_NODE_ID"


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one segment meet. Single-node segments meet on 127.0.0.1."""

    master_addr: str
    master_port: int
    node_rank: int = 0
    nodes: int = 1
    hosts: tuple[str, ...] = ()   # every node's address in rank order (needed by the deepspeed runner)


@dataclass(frozen=True)
class LaunchSpec:
    launcher: Launcher
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)      # set on top of the inherited environment
    unset: tuple[str, ...] = ()                               # removed from the inherited environment
    hostfile: str | None = None                               # content for the deepspeed runner's --hostfile

    def environment(self, inherited: Mapping[str, str]) -> dict[str, str]:
        env = {k: v for k, v in inherited.items() if k not in self.unset}
        env.update(self.env)
        return env


def default_master_port(key: str) -> int:
    """A port every node of a segment derives alike from its key (no coordination needed)."""
    return PORT_BASE + zlib.crc32(key.encode()) % PORT_SPAN


def resolve_rendezvous(assigned: AssignedRendezvous | None, key: str) -> Rendezvous | None:
    """Where this node meets its gang: the assignment's rendezvous (checked by its contract model) with
    the port every node derives alike from the segment id `key` when the scheduler named none."""
    if assigned is None:
        return None
    port = assigned.master_port or default_master_port(key)
    return Rendezvous(assigned.master_addr, port, assigned.node_rank, assigned.nodes, tuple(assigned.hosts))


def gang_nodes(assigned: AssignedRendezvous | None) -> int:
    """How many nodes a segment's rendezvous spans (1 without one)."""
    return assigned.nodes if assigned is not None else 1


def gang_devices(assigned: AssignedRendezvous | None, gpus_per_node: int) -> int:
    """Devices a segment holds across its whole gang (every node's): what rank 0 reports in job.started,
    so metering bills each node's GPU-seconds once (the other nodes report no start of their own)."""
    return max(gpus_per_node, 1) * gang_nodes(assigned)


def build_launch(*, python: str, module: str, config_path: str, plan: DistributedPlan, gpu_ids: Sequence[int],
                 gpu_node: bool, key: str, rendezvous: Rendezvous | None = None, launcher: str = "torchrun",
                 shutdown_timeout_s: int = 60, hostfile_path: str | None = None,
                 extra_env: Mapping[str, str] | None = None, join_timeout_s: int | None = None) -> LaunchSpec:
    """`key` (the segment id) picks the single-node rendezvous port; `shutdown_timeout_s` is how
    long a launcher lets its workers finish an emergency checkpoint after SIGTERM; `join_timeout_s`
    how long a multi-node torchrun waits for the other nodes' launchers to join (torch's 600 s
    otherwise): a node that never reports fails the gang within it."""
    recipe = ("-m", module, "--config", config_path)
    rdzv = rendezvous or Rendezvous("127.0.0.1", default_master_port(key))
    gpus = max(len(gpu_ids), 1)
    visible = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpu_ids))} if gpu_node and gpu_ids else {}
    env = {**(extra_env or {})}
    if plan.zero_init and plan.zero_stage == 3:
        env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] = "true"
    if rdzv.nodes * gpus == 1 and not plan.uses_deepspeed:
        return LaunchSpec("process", (python, *recipe), {**env, **visible}, RANK_VARIABLES)
    ranks = {"MASTER_ADDR": rdzv.master_addr, "MASTER_PORT": str(rdzv.master_port),
             "WORLD_SIZE": str(rdzv.nodes * gpus), "NODE_RANK": str(rdzv.node_rank)}
    unset = tuple(v for v in RANK_VARIABLES if v not in ranks)
    if launcher == "torchrun" or not gpu_node:
        argv = (python, "-m", "torch.distributed.run", f"--nnodes={rdzv.nodes}", f"--nproc-per-node={gpus}",
                f"--node-rank={rdzv.node_rank}", f"--master-addr={rdzv.master_addr}",
                f"--master-port={rdzv.master_port}", "--max-restarts=0", f"--shutdown-timeout={shutdown_timeout_s}",
                *((f"--rdzv-conf=timeout={join_timeout_s}",) if join_timeout_s and rdzv.nodes > 1 else ()),
                *recipe)
        return LaunchSpec("torchrun", argv, {**env, **visible, **ranks}, unset)
    if launcher == "deepspeed":
        return _deepspeed(python, module, config_path, rdzv, gpu_ids, gpus, hostfile_path, {**env, **ranks},
                          unset + ("CUDA_VISIBLE_DEVICES",))
    raise DistributedConfigError(f"unknown launcher {launcher!r} (torchrun or deepspeed)")


def _deepspeed(python: str, module: str, config_path: str, rdzv: Rendezvous, gpu_ids: Sequence[int], gpus: int,
               hostfile_path: str | None, env: dict[str, str], unset: tuple[str, ...]) -> LaunchSpec:
    """The deepspeed runner selects GPUs with --include (it drops CUDA_VISIBLE_DEVICES and sets it
    per worker); across nodes it runs without ssh, one runner per node, from a shared hostfile."""
    ids = ",".join(map(str, gpu_ids or range(gpus)))
    if not hostfile_path:
        raise DistributedConfigError("the deepspeed launcher needs a hostfile path")
    argv = [python, "-m", "deepspeed.launcher.runner", f"--hostfile={hostfile_path}",
            f"--master_addr={rdzv.master_addr}", f"--master_port={rdzv.master_port}", "--module", "--no_local_rank"]
    hostfile = None
    if rdzv.nodes == 1:
        argv.append(f"--include=localhost:{ids}")   # no hostfile is written: the local GPUs are the pool
    else:
        if len(rdzv.hosts) != rdzv.nodes:
            raise DistributedConfigError("multi-node deepspeed launches need every node's host in the rendezvous")
        # other nodes' GPU ids only count ranks here; each node's own runner picks its own GPUs
        include = [f"{h}:{ids if r == rdzv.node_rank else ','.join(map(str, range(gpus)))}"
                   for r, h in enumerate(rdzv.hosts)]
        argv += ["--no_ssh", f"--node_rank={rdzv.node_rank}", f"--include={'@'.join(include)}"]
        hostfile = "".join(f"{h} slots={gpus}\n" for h in rdzv.hosts)
    argv += [module, "--config", config_path]
    return LaunchSpec("deepspeed", tuple(argv), env, unset, hostfile)


def rendezvous_port(launch: LaunchSpec, node_rank: int) -> int | None:
    """The port this node's launcher must listen on to host the ranks' rendezvous (node rank 0 of a
    torchrun or deepspeed launch); None when this node hosts none."""
    if launch.launcher == "process" or node_rank != 0 or "MASTER_PORT" not in launch.env:
        return None
    return int(launch.env["MASTER_PORT"])


def port_taken_message(node_id: str, port: int) -> str:
    return (f"node {node_id}: the rendezvous port {port} that this gang's ranks meet on is already in use by another "
            "process on the node; the ranks could not have met, so nothing was launched (the next attempt derives "
            "another port from its segment id)")

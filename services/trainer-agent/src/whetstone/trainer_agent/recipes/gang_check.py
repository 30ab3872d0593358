"""A gang's process group: joined with the platform's timeout, and only by ranks of one platform build.

On CPU nodes transformers does not hand `ddp_timeout` to accelerate (its use_cpu path passes only the
backend), so the gloo group would wait 30 minutes in a collective whose peer hung: a CPU gang's ranks
join the group here, with the agent's collective timeout, before the trainer is built (accelerate then
uses the group it finds). GPU gangs get the same timeout through `ddp_timeout`.

Every node of a gang runs the same platform build, or the gang does not train.

Ranks built from different platform versions may pack, order or checkpoint differently and train a
silently wrong model, so before the first step every rank tells the others which node it is on
(WHETSTONE_NODE_ID, set by its agent) and which build it runs (the image digest, else the platform
commit: runtime.environment); a gang where any node differs from rank 0's fails on every rank with
`platform_version_mismatch`, naming the nodes and their versions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta

from ..domain.launch import NODE_ID_ENV
from .errors import PlatformError


def join_cpu_process_group(timeout_s: int) -> None:
    """Join the gang's gloo group (env:// from the launcher's rank variables) with `timeout_s`; nothing
    for one process, or when a group exists already."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or not dist.is_available() or dist.is_initialized():
        return
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))


def platform_version() -> str:
    from whetstone.runtime.environment import image_digest, platform_commit

    return image_digest() or platform_commit()[0] or "unknown"


def version_mismatch(members: Sequence[tuple[str, str]]) -> str | None:
    """`members`: (node id, platform version) of every rank, in rank order. Why they may not train
    together (nodes whose version differs from rank 0's), or None."""
    if not members:
        return None
    head_node, head_version = members[0]
    odd: dict[str, str] = {}
    for node, version in members[1:]:
        if version != head_version:
            odd.setdefault(node, version)
    if not odd:
        return None
    others = "; ".join(f"node {node} runs {version}" for node, version in odd.items())
    return (f"platform version mismatch in the gang: {others}, but node {head_node} (rank 0) runs {head_version}; "
            "every node of a multi-node job must run the same platform build")


def check_gang_versions() -> None:
    """Compare every rank's (node, version) with rank 0's; PlatformError naming the odd nodes. Every
    rank calls it at the same point (a collective); nothing without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    mine = (os.environ.get(NODE_ID_ENV) or f"rank-{dist.get_rank()}", platform_version())
    members: list[tuple[str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(members, mine)
    problem = version_mismatch([m for m in members if m is not None])
    if problem:
        raise PlatformError(problem, code="platform_version_mismatch")

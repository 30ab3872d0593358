"""The launch command lines really start ranked workers: torchrun on CPU (gloo needs no GPU),
single node with two workers and two "nodes" of one worker each meeting on localhost.
Every worker prints the rank environment it was given."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest
from whetstone.trainer_agent.adapters.processes import spawn
from whetstone.trainer_agent.domain.distributed import DistributedPlan
from whetstone.trainer_agent.domain.launch import Rendezvous, build_launch

pytestmark = pytest.mark.integration

ENV_DUMP = """
import json, os, pathlib
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "NODE_RANK")
out = pathlib.Path(os.environ["ENV_DUMP_DIR"]) / f"rank-{os.environ['RANK']}.json"
out.write_text(json.dumps({k: os.environ.get(k) for k in keys}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run_launch(spec, tmp_path: Path, name: str) -> tuple[int, list[dict]]:
    """Run a launch; every worker writes its environment to its own file (ranks print concurrently)."""
    dump_dir = tmp_path / name
    dump_dir.mkdir()
    env = spec.environment(os.environ)
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["ENV_DUMP_DIR"] = str(dump_dir)
    proc = await spawn(spec.argv, env, tmp_path / f"{name}.log")
    await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode, [json.loads(p.read_text()) for p in sorted(dump_dir.glob("rank-*.json"))]


def torchrun(tmp_path: Path, gpu_ids: list[int], rendezvous: Rendezvous | None = None):
    plan = DistributedPlan(mode="lora", world_size=len(gpu_ids) * (rendezvous.nodes if rendezvous else 1),
                           zero_stage=2)
    return build_launch(python=sys.executable, module="envdump", config_path="unused.json", plan=plan,
                        gpu_ids=gpu_ids, gpu_node=True, key=f"launch-{free_port()}", rendezvous=rendezvous,
                        shutdown_timeout_s=5)


async def test_torchrun_single_node_gives_each_worker_its_rank(tmp_path):
    (tmp_path / "envdump.py").write_text(ENV_DUMP)
    code, rows = await run_launch(torchrun(tmp_path, [3, 5]), tmp_path, "single")
    assert code == 0, (tmp_path / "single.log").read_text()[-2000:]
    workers = sorted(rows, key=lambda r: int(r["RANK"]))
    assert [(w["RANK"], w["LOCAL_RANK"]) for w in workers] == [("0", "0"), ("1", "1")]
    assert {w["WORLD_SIZE"] for w in workers} == {"2"} and {w["MASTER_ADDR"] for w in workers} == {"127.0.0.1"}
    assert {w["CUDA_VISIBLE_DEVICES"] for w in workers} == {"3,5"}   # local rank i -> i-th assigned GPU


async def test_torchrun_two_nodes_meet_at_the_rendezvous(tmp_path):
    (tmp_path / "envdump.py").write_text(ENV_DUMP)
    port = free_port()
    launches = [torchrun(tmp_path, [0], Rendezvous("127.0.0.1", port, node_rank=r, nodes=2)) for r in (0, 1)]
    results = await asyncio.gather(*(run_launch(spec, tmp_path, f"node{i}") for i, spec in enumerate(launches)))
    for i, (code, _) in enumerate(results):
        assert code == 0, (tmp_path / f"node{i}.log").read_text()[-2000:]
    (_, node0), (_, node1) = results
    assert [(w["RANK"], w["GROUP_RANK"], w["WORLD_SIZE"]) for w in node0] == [("0", "0", "2")]
    assert [(w["RANK"], w["GROUP_RANK"], w["WORLD_SIZE"]) for w in node1] == [("1", "1", "2")]
    assert node1[0]["MASTER_PORT"] == str(port) and node1[0]["LOCAL_RANK"] == "0"

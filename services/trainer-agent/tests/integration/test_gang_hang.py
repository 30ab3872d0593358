"""A rank that hangs in a collective is detected by the process group's timeout (issue 40 p2): two real
processes in a gloo group whose timeout is the agent's setting (WHETSTONE_COLLECTIVE_TIMEOUT_S, what
the recipe joins a CPU gang's gloo group with: recipes/gang_check.py); rank 1 stops answering, rank 0
waits in the collective the platform's monitor runs after every step (`any_rank`) and fails within
the timeout, with an error the agent reads as a lost or hung peer (node_lost, the gang re-queued)."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest
from whetstone.contracts.enums import ErrorClass
from whetstone.trainer_agent.domain.launch import COLLECTIVE_TIMEOUT_ENV
from whetstone.trainer_agent.domain.supervision import gang_peer_lost
from whetstone.devstack.gang_hang import hanging_rank

pytestmark = pytest.mark.integration
TIMEOUT_S = 3


def test_a_rank_hung_in_a_collective_fails_its_peer_within_the_process_group_timeout(monkeypatch):
    monkeypatch.setenv(COLLECTIVE_TIMEOUT_ENV, str(TIMEOUT_S))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=hanging_rank, args=(r, port, out), daemon=True) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=120) for _ in range(2))
        assert set(results) == {"hung", "failed"}, results
        waited, error = results["failed"].split("|", 1)
        assert TIMEOUT_S - 0.5 <= float(waited) < TIMEOUT_S + 30, results["failed"]
        assert gang_peer_lost(2, ErrorClass.PLATFORM, error), error
    finally:
        for p in procs:
            if p.is_alive():
                os.kill(p.pid, 9)
            p.join(10)

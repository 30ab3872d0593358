"""A rank of a two-process gloo group that hangs after its first collective (test support for the
trainer agent's gang-hang test: a spawned process imports its target by module name)."""

from __future__ import annotations

import os
import time
import traceback
from typing import Any


def hanging_rank(rank: int, port: int, out: Any) -> None:
    from whetstone.trainer_agent.recipes.callbacks import any_rank
    from whetstone.trainer_agent.recipes.gang_check import join_cpu_process_group
    from whetstone.trainer_agent.recipes.trainers import collective_timeout_s

    # the rank variables torchrun gives each worker; the recipe joins the group as on a CPU gang
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)})
    join_cpu_process_group(collective_timeout_s())
    any_rank(False)                        # one step both ranks finish
    if rank == 1:
        out.put(("hung", ""))
        time.sleep(120)                    # hung: never reaches the next step's collective
        return
    began = time.monotonic()
    try:
        any_rank(False)
        out.put(("returned", ""))
    except Exception as exc:   # noqa: BLE001 - the error text is what the agent classifies
        out.put(("failed", f"{time.monotonic() - began:.1f}|{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))

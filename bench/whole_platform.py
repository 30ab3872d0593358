"""The whole platform for a bench, in this process: the embedded stack (Kafka, PostgreSQL, S3), the six
core services (ingest, scheduler, trainer agent, eval, registry, metering) and the public gateway,
with one tenant key and the official `openai` client on it, as a tenant's code would hold it. The
trainer agent runs in this process too, or as one `python -m whetstone.trainer_agent` process per node
named in `agent_nodes`, as on separate machines.
Also the one thing a tenant's client cannot do: put a command (`eval.requested`) on the bus and wait
for the eval service's answer, as the registry does when it asks for a re-evaluation."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICES = ("INGEST", "SCHEDULER", "TRAINER_AGENT", "EVAL", "REGISTRY", "METERING")


@dataclass
class RunningPlatform:
    client: Any                 # openai.AsyncOpenAI through the gateway, the tenant's key
    tenant: str
    bootstrap: str              # Kafka bootstrap servers
    runtimes: dict[str, Any]
    catalog: Path

    async def eval_request(self, event: Any, timeout_s: float) -> Any:
        """Publish an `eval.requested` command for the tenant and return the eval service's answer
        (the `eval.completed` event that carries its request_id)."""
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from whetstone.contracts import TOPICS, EvalCompletedV1
        from whetstone.runtime.messaging import (
            decode,
            encode,
            make_envelope,
            parse_payload,
        )

        consumer = AIOKafkaConsumer(TOPICS[EvalCompletedV1.EVENT_TYPE].name, bootstrap_servers=self.bootstrap,
                                    group_id=f"bench-{uuid.uuid4().hex[:8]}", auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await consumer.start()
        await producer.start()
        try:
            env = make_envelope(event, producer="bench", tenant_id=self.tenant)
            await producer.send_and_wait(TOPICS[event.EVENT_TYPE].name, encode(env), key=env.key.encode())
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=1000)).values():
                    for rec in records:
                        answer = parse_payload(decode(rec.value), EvalCompletedV1)
                        if answer.request_id == event.request_id:
                            return answer
            raise TimeoutError(f"no eval.completed for request {event.request_id} in {timeout_s:.0f} s")
        finally:
            await producer.stop()
            await consumer.stop()


@asynccontextmanager
async def running_platform(root: Path, tenant: str = "demo", tiny_models: tuple[str, ...] = ("tiny-llama",),
                           env: dict[str, str] | None = None,
                           agent_nodes: tuple[str, ...] = ()) -> AsyncIterator[RunningPlatform]:
    """Everything under `root`; the tiny random Llama (seed 0) in the catalog under each name given;
    `env`: settings for every service; `agent_nodes`: node ids of trainer agents in processes of
    their own (each logs to `<root>/<node>.log`) instead of the one in this process."""
    import openai
    from whetstone.cli.dev import build_services, core_service_builders, upstreams_of
    from whetstone.cli.keys import create_key
    from whetstone.contracts import all_topic_partitions
    from whetstone.devstack.stack import EmbeddedStack
    from whetstone.gateway.config import GatewaySettings
    from whetstone.gateway.server import start_gateway
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.service import run_services
    from whetstone.runtime.settings import CommonSettings

    stack = EmbeddedStack(root / "stack", topics=all_topic_partitions(), buckets=["whetstone"], log=lambda m: None)
    endpoints = await asyncio.to_thread(stack.start)
    agents: list[subprocess.Popen] = []
    try:
        os.environ.update({**endpoints.as_env(), "WHETSTONE_DATA_DIR": str(root), "HF_HUB_OFFLINE": "1",
                           "WHETSTONE_LOG_LEVEL": os.environ.get("WHETSTONE_LOG_LEVEL", "WARNING"),
                           **{f"WHETSTONE_{s}_HTTP_PORT": "0" for s in SERVICES}, **(env or {})})
        settings = CommonSettings(log_json=True)
        for name in tiny_models:
            await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / name, seed=0)
        builders = core_service_builders()
        for node in agent_nodes:
            agents.append(subprocess.Popen([sys.executable, "-m", "whetstone.trainer_agent"],  # noqa: ASYNC220 - returns at once
                                           stdout=(root / f"{node}.log").open("wb"), stderr=subprocess.STDOUT,
                                           env={**os.environ, "WHETSTONE_TRAINER_AGENT_NODE_ID": node}))
        if agent_nodes:
            builders = [b for b in builders if not b.__module__.startswith("whetstone.trainer_agent")]
        stop = asyncio.Event()
        started: asyncio.Future = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(run_services(build_services(builders, []), settings,
                                                started.set_result, stop, handle_signals=False))
        try:
            await asyncio.wait((task, started), return_when=asyncio.FIRST_COMPLETED)
            if not started.done():
                task.result()
            runtimes = {rt.name: rt for rt in started.result()}
            upstreams = upstreams_of(runtimes.values())
            gateway = await start_gateway(GatewaySettings(), upstreams, port=0)
            try:
                key = (await asyncio.to_thread(create_key, tenant, name=f"bench-{root.name}", scopes=["read", "write"],
                                               base_url=upstreams["scheduler"]))["key"]
                client = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=2, timeout=120)
                yield RunningPlatform(client, tenant, endpoints.kafka_bootstrap, runtimes,
                                      Path(settings.model_catalog))
            finally:
                await gateway.stop()
        finally:
            stop.set()
            await task
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
        await asyncio.to_thread(stack.stop, discard=True)


def jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)

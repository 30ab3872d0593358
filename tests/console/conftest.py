"""One running platform (the real embedded stack, every service, the gateway) and one headless
Debian Chromium for the whole module: browser tests reuse both instead of starting their own.

Each test gets a fresh browser context (its own cookies) and leaves a screenshot of its last page
under .whetstone/artifacts/console/<test>.png."""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from whetstone.contracts import all_topic_partitions
from whetstone.devstack.testing import use_stack

CHROMIUM = Path(os.environ.get("WHETSTONE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parents[2] / ".whetstone" / "artifacts" / "console"


@dataclass
class Console:
    url: str                       # the gateway: console at /, API at /v1
    scheduler: str                 # the scheduler's own URL (operator calls: keys)
    keys: dict[str, dict]          # name -> the created key object (with its secret `key`)
    state: dict = field(default_factory=dict)   # what one test leaves for the next (ids)


def key_for(console: Console, name: str) -> str:
    return console.keys[name]["key"]


@pytest.fixture(scope="module")
def chromium_path() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} missing: `sh deploy/tools/ensure-chromium.sh` (run by `make test`) installs it")
    return CHROMIUM


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def console(tmp_path_factory, chromium_path):
    from whetstone.cli.dev import all_service_builders, build_services, upstreams_of
    from whetstone.cli.keys import create_key
    from whetstone.devstack.stack import EmbeddedStack
    from whetstone.gateway.config import GatewaySettings
    from whetstone.gateway.server import start_gateway
    from whetstone.modelkit.tiny import build_tiny_model
    from whetstone.runtime.service import run_services

    root = tmp_path_factory.mktemp("console")
    stack = EmbeddedStack(root / "stack", topics=all_topic_partitions(), buckets=["whetstone"], log=lambda m: None)
    endpoints = await asyncio.to_thread(stack.start)
    env = pytest.MonkeyPatch()
    try:
        settings = use_stack(env, endpoints.as_env(), root)
        await asyncio.to_thread(build_tiny_model, Path(settings.model_catalog) / "tiny-llama")
        stop = asyncio.Event()
        started: asyncio.Future = asyncio.get_running_loop().create_future()
        services = build_services(all_service_builders()[:6], all_service_builders()[6:])
        task = asyncio.create_task(run_services(services, settings, started.set_result, stop, handle_signals=False))
        await asyncio.wait((task, started), return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            task.result()
        upstreams = upstreams_of(started.result())
        gateway = await start_gateway(GatewaySettings(), upstreams, port=0)
        try:
            specs = {"demo": ("demo", ["read", "write", "models:promote"]), "demo-read": ("demo", ["read"]),
                     "demo-admin": ("demo", ["admin"]), "acme": ("acme", ["read", "write"]),
                     "doomed": ("demo", ["read", "write"])}
            keys = {name: await asyncio.to_thread(create_key, tenant, name=name, scopes=scopes,
                                                  base_url=upstreams["scheduler"])
                    for name, (tenant, scopes) in specs.items()}
            yield Console(gateway.url, upstreams["scheduler"], keys)
        finally:
            stop.set()
            await gateway.stop()
            await task
    finally:
        env.undo()
        await asyncio.to_thread(stack.stop, discard=True)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser(chromium_path):
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=str(chromium_path), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser, console, request):
    """A fresh context (no cookies) on the console; a screenshot of where the test ended."""
    context = await browser.new_context(base_url=console.url, viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    try:
        yield page
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
        try:
            await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        finally:
            await context.close()


async def sign_in(page, key: str) -> None:
    await page.goto("/")
    await page.get_by_label("API key").fill(key)
    await page.get_by_role("button", name="Sign in").click()
    await page.locator("#sign-out").wait_for()

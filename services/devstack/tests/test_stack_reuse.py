"""What makes a test's stack cheap: initdb's cluster made once and copied, and a stop that kills
the servers whose data is deleted next."""

from __future__ import annotations

import time
from pathlib import Path

import asyncpg
import psutil
import pytest

from whetstone.devstack import pgtemplate
from whetstone.devstack.stack import EmbeddedStack

pytestmark = pytest.mark.integration


async def _roundtrip(url: str) -> list:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        await conn.execute("INSERT INTO t VALUES (1, 'one')")
        return [tuple(r) for r in await conn.fetch("SELECT id, v FROM t")]
    finally:
        await conn.close()


async def test_the_second_stack_copies_the_first_ones_initdb_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                      ) -> None:
    cache = tmp_path / "templates"
    monkeypatch.setenv("WHETSTONE_PG_TEMPLATE_DIR", str(cache))
    logs: list[str] = []
    for name in ("first", "second"):
        stack = EmbeddedStack(tmp_path / name, log=logs.append)
        endpoints = stack.start()
        try:
            # each database is its own: the table made in the first one is not in the copy
            assert await _roundtrip(endpoints.database_url) == [(1, "one")]
        finally:
            stack.stop(discard=True)
    kept = [m for m in logs if "kept as a template" in m]
    assert len(kept) == 1, logs                           # made by the first stack only
    name = Path(kept[0].rsplit(" ", 1)[1]).name
    assert sorted(p.name for p in cache.iterdir()) == [name, f"{name}.json"]   # the cluster and its file list
    # the second stack's "initdb" was the copy: initdb would have written its banner to the log
    assert "The files belonging to this database system" in (tmp_path / "first/logs/postgres-initdb.log").read_text()
    assert (tmp_path / "second/logs/postgres-initdb.log").read_text() == ""


@pytest.mark.parametrize("damage", ["truncated", "deleted", "unlisted"])
async def test_a_damaged_template_is_made_again_instead_of_breaking_every_stack(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    cache = tmp_path / "templates"
    monkeypatch.setenv("WHETSTONE_PG_TEMPLATE_DIR", str(cache))
    first = EmbeddedStack(tmp_path / "first", log=lambda m: None)
    first.start()
    first.stop(discard=True)
    [template] = [p for p in cache.iterdir() if p.is_dir()]
    if damage == "truncated":      # a cluster that cannot start: its control file cut short
        (template / "global" / "pg_control").write_bytes(b"")
    elif damage == "deleted":
        (template / "PG_VERSION").unlink()
    else:                          # a template kept without its file list (or the list lost)
        template.with_name(f"{template.name}.json").unlink()
    logs: list[str] = []
    stack = EmbeddedStack(tmp_path / "second", log=logs.append)
    endpoints = stack.start()
    try:
        assert await _roundtrip(endpoints.database_url) == [(1, "one")]
    finally:
        stack.stop(discard=True)
    assert any("is damaged" in m for m in logs), logs
    # initdb ran again (its banner is in the log) and kept a sound template for the next stack
    assert "The files belonging to this database system" in (tmp_path / "second/logs/postgres-initdb.log").read_text()
    assert pgtemplate.usable(template, logs.append)


def test_no_template_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHETSTONE_PG_TEMPLATE_DIR", "off")
    assert pgtemplate.template_for(Path("/nonexistent"), ["--no-sync"], 0) is None


def test_a_discarded_stack_stops_at_once_and_leaves_no_process(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path / "stack", buckets=["discarded"], log=lambda m: None)
    stack.start()
    servers = [psutil.Process(pid) for pid in stack.pids]
    servers += [c for p in servers for c in p.children(recursive=True)]
    began = time.monotonic()
    stack.stop(discard=True)
    took = time.monotonic() - began
    alive = [p for p in servers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    # a graceful stop waits out SeaweedFS's stop timeout (2 s); a discarded stack does not
    assert took < 1.5, took

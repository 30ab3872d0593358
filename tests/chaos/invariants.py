"""What must hold after the chaos run, read from each service's own tables (and the DLQ topics).

Each check returns a list of violations (strings naming the job, segment or record); empty means it held.
The ground truth for metering is the agents' own records: the segment starts and stops in the
trainer agents' outbox (what they reported), plus the stops the scheduler itself issued for segments
whose node it declared lost (the agent never got to report those)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal

import asyncpg

TERMINAL = ("succeeded", "failed", "cancelled")
STOPS = ("job.completed", "job.failed", "job.preempted")


async def events(conn: asyncpg.Connection, schema: str, topics: tuple[str, ...]) -> list[dict]:
    rows = await conn.fetch(f"SELECT topic, value FROM {schema}.outbox WHERE topic = ANY($1::text[]) ORDER BY id",
                            list(topics))
    out = []
    for r in rows:
        env = json.loads(bytes(r["value"]))
        env["topic"] = r["topic"]
        out.append(env)
    return out


def at(s: str) -> datetime:
    return datetime.fromisoformat(s)


def micros(start: datetime, stop: datetime) -> Decimal:
    return Decimal((stop - start) // timedelta(microseconds=1)).scaleb(-6)


async def check_jobs(conn: asyncpg.Connection, planned: dict[str, str]) -> tuple[list[str], dict[str, dict]]:
    """planned: idempotency key -> expected outcome. Every planned job that the API accepted exists and
    is terminal; a job meant to fail failed as the user's error; a sound job never failed as the user's."""
    rows = await conn.fetch("SELECT job_id, idempotency_key, status, error, attempt, fenced_attempt"
                            " FROM scheduler.jobs")
    by_key = {r["idempotency_key"]: r for r in rows}
    bad, jobs = [], {}
    for key, expect in planned.items():
        r = by_key.get(key)
        if r is None:
            bad.append(f"job {key}: accepted by the API but unknown to the scheduler (lost)")
            continue
        error = json.loads(r["error"]) if isinstance(r["error"], str) else (r["error"] or {})
        jobs[r["job_id"]] = {"key": key, "status": r["status"], "error_class": error.get("error_class"),
                             "code": error.get("code"), "message": (error.get("message") or "")[:300],
                             "attempt": r["attempt"], "expect": expect}
        if r["status"] not in TERMINAL:
            bad.append(f"job {key} ({r['job_id']}): still {r['status']} after the drain")
        elif expect == "failed" and (r["status"] != "failed" or error.get("error_class") != "user"):
            bad.append(f"job {key}: meant to fail as a user error, ended {r['status']} {error}")
        elif expect == "succeeded" and r["status"] == "failed" and error.get("error_class") == "user":
            bad.append(f"job {key}: a sound job failed as the user's error: {error}")
    return bad, jobs


async def check_models(conn: asyncpg.Connection, jobs: dict[str, dict]) -> list[str]:
    bad = []
    models = await conn.fetch("SELECT model_id, job_id FROM registry.models")
    per_job: dict[str, list[str]] = defaultdict(list)
    for m in models:
        per_job[m["job_id"]].append(m["model_id"])
    for job_id, j in jobs.items():
        n = len(per_job.get(job_id, []))
        if j["status"] == "succeeded" and n != 1:
            bad.append(f"job {j['key']}: succeeded with {n} models")
        if j["status"] != "succeeded" and n:
            bad.append(f"job {j['key']}: {j['status']} but has a model")
    registered = await events(conn, "registry", ("model.registered",))
    ids: dict[str, set[str]] = defaultdict(set)
    for e in registered:
        ids[e["payload"]["model_id"]].add(e["event_id"])
    bad += [f"model {m}: registered by {len(s)} different events" for m, s in ids.items() if len(s) > 1]
    history = await conn.fetch("SELECT model_id, from_stage, to_stage, count(*) AS n FROM registry.stage_history"
                               " GROUP BY 1, 2, 3 HAVING count(*) > 1")
    bad += [f"model {h['model_id']}: {h['from_stage']} -> {h['to_stage']} recorded {h['n']} times" for h in history]
    promoted = await events(conn, "registry", ("model.promoted",))
    seen: dict[tuple, set[str]] = defaultdict(set)
    for e in promoted:
        p = e["payload"]
        seen[(p.get("model_id"), p.get("from_stage"), p.get("to_stage"))].add(e["event_id"])
    bad += [f"model {k[0]}: promotion {k[1]} -> {k[2]} published as {len(s)} events" for k, s in seen.items()
            if len(s) > 1]
    return bad


async def ground_truth(conn: asyncpg.Connection) -> dict[tuple[str, str], Decimal]:
    """GPU-seconds per segment from the agents' reports: the latest start, the earliest stop."""
    reports = await events(conn, "trainer_agent", ("job.started", *STOPS))
    reports += [e for e in await events(conn, "scheduler", STOPS) if e["payload"].get("segment_id")]
    starts: dict[tuple, tuple[datetime, int]] = {}
    stops: dict[tuple, datetime] = {}
    for e in reports:
        p = e["payload"]
        seg = (p["job_id"], p.get("segment_id"))
        if e["topic"] == "job.started":
            s = (at(p["started_at"]), p["gpu_count"])
            starts[seg] = max(starts.get(seg, s), s)
        elif p.get("stopped_at"):
            stops[seg] = min(stops.get(seg, at(p["stopped_at"])), at(p["stopped_at"]))
    # a stop before the start (the node was declared lost before its start was reported) bills nothing
    return {seg: micros(start, stops[seg]) * gpus for seg, (start, gpus) in starts.items()
            if seg in stops and stops[seg] >= start}


async def check_metering(conn: asyncpg.Connection, jobs: dict[str, dict]) -> list[str]:
    truth = await ground_truth(conn)
    lines = await conn.fetch("SELECT job_id, scope, segment_id, gpu_seconds FROM metering.ledger")
    net: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    totals: dict[str, int] = defaultdict(int)
    for r in lines:
        if r["scope"] == "segment":
            net[(r["job_id"], r["segment_id"])] += r["gpu_seconds"]
        else:
            totals[r["job_id"]] += 1
    bad = []
    for seg in sorted(set(truth) | set(net)):
        want, got = truth.get(seg), net.get(seg)
        if want is None:
            bad.append(f"segment {seg}: billed {got} GPU-s, but no agent reported both its start and its stop")
        elif got is None:
            bad.append(f"segment {seg}: agents report {want} GPU-s, the ledger has nothing")
        elif abs(want - got) > Decimal("0.000002"):
            bad.append(f"segment {seg}: ledger {got} GPU-s, agents report {want}")
    for job_id, j in jobs.items():
        ran = any(s[0] == job_id for s in truth)
        if j["status"] in TERMINAL and ran and totals.get(job_id, 0) == 0:
            bad.append(f"job {j['key']}: terminal, ran, but the ledger has no job total")
    return bad


async def check_fencing(conn: asyncpg.Connection) -> tuple[int, list[str]]:
    """Every attempt the scheduler fenced: nothing it wrote after the fence changed the scheduler's
    checkpoints, the eval's or the registry's final checkpoint, or a model."""
    fences = await events(conn, "scheduler", ("node.fenced",))
    written = await events(conn, "trainer_agent", ("checkpoint.written", "job.completed"))
    bad = []
    for f in fences:
        p = f["payload"]
        job_id, attempt, fenced_at = p["job_id"], p["attempt"], at(f["occurred_at"])
        stale = [e["payload"] for e in written if e["payload"]["job_id"] == job_id
                 and (e["payload"].get("attempt") or 0) <= attempt and at(e["occurred_at"]) > fenced_at]
        for s in stale:
            uri = s.get("uri") or (s.get("final_checkpoint") or {}).get("uri")
            for table in ("scheduler.job_checkpoints", "registry.final_checkpoints", "eval.final_checkpoints",
                          "registry.models"):
                col = "artifact_uri" if table.endswith("models") else "uri"
                if uri and await conn.fetchval(f"SELECT count(*) FROM {table} WHERE job_id = $1 AND {col} = $2",
                                               job_id, uri):
                    bad.append(f"job {job_id}: {table} took {uri} from fenced attempt {attempt}")
    return len(fences), bad


def paused_claim(letter, paused: dict[str, list[str]]) -> bool:
    """A heartbeat of the node the driver paused, refused because it still claims (only) the jobs it ran
    when paused, which the scheduler moved meanwhile: the partition's output, like its stale events."""
    if letter.source_topic != "node.heartbeat" or "foreign_job_claim" not in letter.error:
        return False
    claimed = letter.error.rsplit(":", 1)[-1].replace(",", " ").split()
    return letter.key in paused and bool(claimed) and set(claimed) <= set(paused[letter.key])


def check_dlq(letters: list, poison_keys: set[str], paused: dict[str, list[str]]) -> tuple[list[str], dict[str, int]]:
    """The DLQ holds only what the run injected: the poison records, and the events of attempts the scheduler
    fenced after the node pause or a kill (refused as stale_attempt, with the reason; they are the injected
    partition's output), and the paused node's heartbeats claiming the jobs moved off it. Anything else is
    a violation."""
    kinds: dict[str, int] = defaultdict(int)
    bad = []
    for x in letters:
        kind = ("poison" if x.key in poison_keys else "fenced_attempt" if "stale_attempt" in x.error
                else "paused_node_claim" if paused_claim(x, paused) else "other")
        kinds[kind] += 1
        if kind == "other":
            bad.append(f"{x.dlq_topic}@{x.dlq_offset}: key {x.key!r} is not injected poison ({x.error[:200]})")
    return bad, dict(kinds)

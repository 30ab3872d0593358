"""The gate with a pool of worker processes gives byte-for-byte the result of one process:
same cleaned files, same audit trail, same report (errors, warnings, layouts, counts)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from whetstone.ingest.adapters.formats import open_source
from whetstone.ingest.domain.contamination import ReferenceIndex
from whetstone.ingest.domain.policies import Policies
from whetstone.ingest.domain.rows import LayoutGate
from whetstone.ingest.domain.toxicity import WordlistToxicity
from whetstone.ingest.usecases.passes import prepare
from whetstone.ingest.usecases.pipeline import DataGate, GateConfig

pytestmark = pytest.mark.integration

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"]
REFERENCE = " ".join(WORDS * 2)


def sentence(i: int, n: int = 40) -> str:
    return " ".join(WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] + str((i * 31 + k) % 97 if k % 9 == 0 else "")
                    for k in range(n))


def rows() -> list[bytes]:
    out: list[bytes] = []
    for i in range(2, 400):
        kind = i % 23
        if kind == 0:
            out.append(b"{not json")
        elif kind == 1:
            out.append(json.dumps({"text": "a text row in a chat file"}).encode())          # mixed_schema
        elif kind == 2:
            out.append(json.dumps({"conversations": [{"from": "human", "value": sentence(i)},
                                                     {"from": "gpt", "value": sentence(i + 1)}]}).encode())
        elif kind == 3:                                                                       # PII
            out.append(json.dumps({"messages": [{"role": "user", "content": f"mail me at u{i}@example.com"},
                                                {"role": "assistant", "content": sentence(i)}]}).encode())
        elif kind == 4:                                                                       # exact duplicate
            out.append(out[-2])
        elif kind == 5:                                                                       # contamination
            out.append(json.dumps({"messages": [{"role": "user", "content": REFERENCE},
                                                {"role": "assistant", "content": "ok"}]}).encode())
        elif kind == 6:                                                                       # toxicity
            out.append(json.dumps({"messages": [{"role": "user", "content": "you bastard " + sentence(i)},
                                                {"role": "assistant", "content": sentence(i + 2)}]}).encode())
        elif kind == 7:                                                                       # near duplicate
            text = sentence(i - 3, 120)
            out.append(json.dumps({"messages": [{"role": "user", "content": "q"},
                                                {"role": "assistant", "content": text + " zulu"}]}).encode())
        elif kind == 8:                                                                       # UltraFeedback: 2 layouts
            out.append(json.dumps({"messages": [{"role": "user", "content": sentence(i)},
                                                {"role": "assistant", "content": sentence(i + 3)}],
                                   "prompt": "p", "chosen": "c", "rejected": "r"}).encode())
        else:                                                                                 # ignored keys: many
            out.append(json.dumps({"messages": [{"role": "user", "content": "q"},
                                                {"role": "assistant", "content": sentence(i, 120)}],
                                   f"extra_{i % 70}": 1, "id": i}).encode())
    return out


def run(path: Path, work: Path, workers: int, pii: str, timings: dict | None = None,
        **config: int) -> tuple[dict, dict[str, bytes]]:
    references = ReferenceIndex()
    references.add("bench", [REFERENCE])
    config = {"chunk_rows": 7, "parallel_min_rows": 20, **config}
    gate = DataGate(GateConfig(policies=Policies(pii=pii), workers=workers, **config), references=references,
                    toxicity=WordlistToxicity())
    result = gate.run(open_source(path, workdir=work / "src"), work / "gate")
    report = result.report.as_dict()
    (timings if timings is not None else {}).update(report.pop("timings"))
    files = {p.name: p.read_bytes() for p in (result.train_path, result.validation_path, result.audit_path) if p}
    return report, files


@pytest.mark.parametrize("pii", ["warn", "redact"])
def test_pool_gives_the_single_process_result(tmp_path, pii):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(rows()) + b"\n")
    single, single_files = run(path, tmp_path / "one", 1, pii)
    pooled, pooled_files = run(path, tmp_path / "two", 2, pii)
    assert single["error_counts"].get("mixed_schema") and single["pii_hits"] and single["contaminated"]
    assert single["exact_duplicates"] and single["toxic"] and single["ignored_keys"]
    assert pooled == single
    assert pooled_files == single_files


def test_a_broken_pool_falls_back_to_this_process(tmp_path, monkeypatch, caplog):
    """Workers that cannot start (here: their context file is garbage) break the pool: the gate
    prepares the chunks itself, in order, and the result is still the single-process one."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(rows()) + b"\n")
    single, single_files = run(path, tmp_path / "one", 1, "warn")
    monkeypatch.setattr(prepare.pickle, "dump", lambda obj, f, protocol=None: f.write(b"not a pickle"))
    pooled, pooled_files = run(path, tmp_path / "two", 2, "warn")
    assert "pool broken" in caplog.text
    assert pooled == single and pooled_files == single_files


def test_a_large_file_has_its_workers_from_the_second_chunk(tmp_path):
    """A file of at least `parallel_min_bytes` starts its pool while the first chunk (which fixes the
    schema) is prepared here, and hands the workers every chunk after it, whatever `parallel_min_rows`
    says; the result is still the single-process one."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(rows()) + b"\n")
    single, single_files = run(path, tmp_path / "one", 1, "warn")
    timings: dict = {}
    pooled, pooled_files = run(path, tmp_path / "two", 2, "warn", timings, parallel_min_rows=10**9,
                               parallel_min_bytes=path.stat().st_size)
    assert timings.get("workers_cpu_s") is not None          # the workers prepared chunks
    assert pooled == single and pooled_files == single_files
    small: dict = {}
    run(path, tmp_path / "three", 2, "warn", small, parallel_min_rows=10**9, parallel_min_bytes=path.stat().st_size + 1)
    assert "workers_cpu_s" not in small                       # smaller than both limits: this process only


def test_the_pool_maps_in_its_workers_in_order(tmp_path):
    """`Preparer.map` (the near-duplicate check's exact Jaccards) runs in the worker processes while the
    pool is up, results in the order of the items, and in this process without a pool."""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(rows()) + b"\n")
    layouts = LayoutGate()
    preparer = prepare.Preparer(prepare.PrepareContext("warn", 1 << 20, None, None, None, False), layouts, tmp_path,
                                workers=2, chunk_rows=7, min_rows=20)
    try:
        assert preparer.map(abs, [-1, -2]) == [1, 2] and preparer.pool is None
        list(preparer.run(open_source(path, workdir=tmp_path / "src").records()))
        assert preparer.pool is not None
        assert preparer.map(abs, list(range(-50, 0))) == list(range(50, 0, -1))
        pids = set(preparer.map(_pid, list(range(8))))
        assert pids and os.getpid() not in pids
    finally:
        preparer.close()


def _pid(_: int) -> int:
    return os.getpid()

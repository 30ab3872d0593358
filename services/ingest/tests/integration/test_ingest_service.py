"""The ingest service on the real embedded stack: dataset.submitted in, dataset.validated out."""

from __future__ import annotations

import gzip
import hashlib
import json

import pytest

from whetstone.contracts import DatasetSubmittedV1, DatasetValidatedV1, dataset_id_for
from whetstone.ingest.bootstrap import build_service
from whetstone.ingest.config import IngestSettings
from whetstone.devstack.testing import outbox, send_event, wait_until

pytestmark = pytest.mark.integration


def jsonl(rows) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def upload(rt, tenant: str, data: bytes, suffix: str = ".jsonl", name: str | None = None,
           **fields) -> DatasetSubmittedV1:
    digest = hashlib.sha256(data).hexdigest()
    uri = rt.store.put_bytes(f"tenants/{tenant}/uploads/{digest}{suffix}", data)
    return DatasetSubmittedV1(dataset_id=dataset_id_for(digest), name=name or f"data{suffix}", source_uri=uri,
                              size_bytes=len(data), **fields)


async def verdicts(rt, dataset_id: str, count: int = 1) -> list[dict]:
    async def found():
        got = [e for e in await outbox(rt, "dataset.validated") if e["payload"]["dataset_id"] == dataset_id]
        return got if len(got) >= count else None
    return await wait_until(found, 60, f"{count} dataset.validated for {dataset_id}")


async def test_chat_upload_is_validated_stored_and_immutable(platform, settings, kit):
    rows = kit.good_rows(40) + [kit.good_rows(1)[0]]  # one exact duplicate
    async with platform(build_service) as p:
        rt = p["ingest"]
        sub = upload(rt, "demo", jsonl(rows))
        await send_event(settings.kafka_bootstrap, sub, "demo")
        [env] = await verdicts(rt, sub.dataset_id)
        v = DatasetValidatedV1.model_validate(env["payload"])
        assert v.status == "accepted" and v.format == "jsonl" and v.data_schema == "chat" and v.purpose == "sft"
        assert v.version == hashlib.sha256(jsonl(rows)).hexdigest() and v.dataset_id == dataset_id_for(v.version)
        assert v.rows_total == 41 and v.rows_kept == 40 and v.stats.exact_duplicates == 1
        assert v.tokens_total and v.stats.tokens_estimated and v.stats.token_histogram
        assert v.policies["pii"] == "warn" and v.policies["near_dup_threshold"] == "0.9"
        cost = v.cost_estimate
        assert cost and cost.cheapest and cost.cheapest.gpu_hours > 0 and cost.estimates
        prefix = f"s3://whetstone/tenants/demo/datasets/{sub.dataset_id}/"
        assert v.train_uri == prefix + "train.jsonl" and v.raw_uri == prefix + "raw.jsonl"
        train = [json.loads(x) for x in rt.store.get_bytes(v.train_uri).splitlines()]
        val = [json.loads(x) for x in rt.store.get_bytes(v.validation_uri).splitlines()]
        assert len(train) + len(val) == 40 and all(set(r) == {"messages"} for r in train + val)
        assert rt.store.get_bytes(v.raw_uri) == jsonl(rows)
        report = json.loads(rt.store.get_bytes(v.report_uri))
        assert report["rows_kept"] == 40 and report["dataset_id"] == sub.dataset_id and report["stats"]["roles"]

        again = sub.model_copy(update={"name": "renamed.jsonl"})
        await send_event(settings.kafka_bootstrap, again, "demo")
        first, second = await verdicts(rt, sub.dataset_id, 2)
        assert second["payload"] == first["payload"]  # the same version, the same verdict
        assert await rt.pool.fetchval("SELECT count(*) FROM dataset_versions") == 1


async def test_tenant_policies_references_and_tokenized_cache(platform, settings, kit, ingest_tiny_model):
    question = ("Which planet in the solar system has the largest number of confirmed moons orbiting it "
                "according to the most recent astronomical surveys")
    config = IngestSettings(tenant_policies={"acme": {"pii": "redact", "contamination": "remove"}})
    rows = kit.good_rows(20) + [
        {"messages": [{"role": "user", "content": question + "?"}, {"role": "assistant", "content": "Saturn."}]},
        kit.chat_row(99, "Reach me at ceo@acme.example for details."),
    ]
    async with platform(lambda: build_service(config)) as p:
        rt = p["ingest"]
        rt.store.put_bytes("tenants/acme/references/astro-eval.jsonl", jsonl([{"q": question, "a": "Saturn"}]))
        sub = upload(rt, "acme", jsonl(rows), base_model=str(ingest_tiny_model))
        await send_event(settings.kafka_bootstrap, sub, "acme")
        [env] = await verdicts(rt, sub.dataset_id)
        v = DatasetValidatedV1.model_validate(env["payload"])
        assert v.status == "accepted", v.errors
        assert v.rows_kept == 21 and v.stats.contaminated == 1 and v.stats.pii_hits == 1
        assert v.stats.references == {"astro-eval": {"items": 1, "ngrams": 11}}
        assert v.stats.contamination_examples and v.stats.contamination_examples[0].line == 21
        assert v.policies["pii"] == "redact" and v.policies["contamination"] == "remove"
        text = rt.store.get_bytes(v.train_uri) + (rt.store.get_bytes(v.validation_uri) if v.validation_uri else b"")
        assert b"[EMAIL]" in text and b"ceo@acme" not in text and b"Saturn" not in text
        assert not v.stats.tokens_estimated and v.cost_estimate and v.cost_estimate.params_source == "safetensors"
        tok = v.stats.tokenization
        assert tok and tok.tokenized_uri and len(tok.mask_preview) == 3 and tok.tokenized_cache == "written"
        assert v.stats.tokenized_uri == tok.tokenized_uri and v.stats.tokenized_cache == "written"
        manifest = json.loads(rt.store.get_bytes(tok.tokenized_uri + "/manifest.json"))
        assert manifest["dataset_version"] == v.version and manifest["tokenizer_hash"] == tok.tokenizer_hash
        cached = b"".join(rt.store.get_bytes(f"{tok.tokenized_uri}/{side}") for side in manifest["files"].values())
        assert sum(len(json.loads(x)["input_ids"]) for x in cached.splitlines()) == v.tokens_total
        audit = [json.loads(x) for x in rt.store.get_bytes(v.stats.audit_uri or "").splitlines()]
        assert {(a["line"], a["reason"]) for a in audit} == {(21, "contamination"), (22, "pii")}

        # the same content for another base model that shares the tokenizer: the cache is reused
        twin = ingest_tiny_model.parent / "twin"
        if not twin.exists():
            import shutil
            shutil.copytree(ingest_tiny_model, twin)
        await send_event(settings.kafka_bootstrap, sub.model_copy(update={"base_model": str(twin)}), "acme")
        _, env2 = await verdicts(rt, sub.dataset_id, 2)
        assert env2["payload"]["stats"]["tokenization"]["tokenized_cache"] == "hit"
        assert env2["payload"]["tokens_total"] == v.tokens_total


class Exploding:
    name = "exploding"

    def scores(self, texts):
        raise RuntimeError("classifier bug")


async def test_bad_uploads_get_a_rejection_with_a_reason_and_never_stop_the_service(platform, settings, kit):
    config = IngestSettings(max_upload_bytes=60_000, max_unpacked_bytes=8 * 2**20, max_compression_ratio=50.0)
    good = jsonl(kit.good_rows(15))
    variants = iter(range(1, 100))

    def unique() -> bytes:  # distinct bytes, so every case has its own dataset_id
        return good + b"\n" * next(variants)

    async with platform(lambda: build_service(config)) as p:
        rt = p["ingest"]
        boot = settings.kafka_bootstrap
        cases: dict[str, DatasetSubmittedV1] = {}
        cases["archive_bomb"] = upload(rt, "demo", gzip.compress(b"\0" * (20 * 2**20)), ".gz", "data.jsonl.gz")
        cases["binary_file"] = upload(rt, "demo", b"\x7fELF\x02\x01\x01\x00\x00" * 50)
        cases["unsafe_name"] = upload(rt, "demo", unique(), name="../../etc/passwd")
        cases["empty_file"] = upload(rt, "demo", b"")
        cases["file_too_large"] = upload(rt, "demo", b"x" * 70_000)
        cases["unsupported_format"] = upload(rt, "demo", unique(), ".exe", "tool.exe")
        cases["base_model_unavailable"] = upload(rt, "demo", unique(), base_model="/nowhere/model")
        mismatch = upload(rt, "demo", unique())
        cases["dataset_id_mismatch"] = mismatch.model_copy(update={"dataset_id": "ds-" + "0" * 24})
        cases["source_missing"] = mismatch.model_copy(update={"dataset_id": "ds-" + "1" * 24,
                                                              "source_uri": "s3://whetstone/tenants/demo/uploads/no"})
        cases["source_outside_tenant"] = mismatch.model_copy(update={"dataset_id": "ds-" + "2" * 24,
                                                                     "source_uri": "s3://whetstone/tenants/acme/x"})
        cases["hub_unreachable"] = mismatch.model_copy(update={"dataset_id": "ds-" + "3" * 24,
                                                               "source_uri": "hf://datasets/org/name"})
        for sub in cases.values():
            await send_event(boot, sub, "demo")
        unknown = upload(rt, "demo", unique())
        await send_event(boot, unknown, "nobody")
        for code, sub in {**cases, "unknown_tenant": unknown}.items():
            [env] = await verdicts(rt, sub.dataset_id)
            assert env["payload"]["status"] == "rejected", code
            assert env["payload"]["errors"][0]["code"] == code, env["payload"]["errors"]
            assert env["payload"]["errors"][0]["message"]

        classifier, rt.ctx.toxicity = rt.ctx.toxicity, Exploding()
        broken = upload(rt, "demo", unique())
        await send_event(boot, broken, "demo")
        [env] = await verdicts(rt, broken.dataset_id)
        assert env["payload"]["errors"][0]["code"] == "processing_failed"

        rt.ctx.toxicity = classifier
        fine = upload(rt, "demo", unique())
        await send_event(boot, fine, "demo")
        [env] = await verdicts(rt, fine.dataset_id)
        assert env["payload"]["status"] == "accepted"
        dead = rt.metrics.registry.get_sample_value(
            "whetstone_messages_consumed_total", {"topic": "dataset.submitted", "outcome": "dead_lettered"})
        assert not dead

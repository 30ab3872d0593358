"""Every request a tenant (or an external producer) can send is bounded field by field, so no request
can make an event larger than the bus takes: each string has a maxLength, each array a maxItems, each
free-form object a maxProperties with bounded keys, and free-form JSON (`JsonAtMost`) a byte bound.

The request models are found, not listed: every JSON body of every route of every service with an
HTTP API (the services' own OpenAPI documents, built in process), plus the events external producers
may put on the bus (`job.requested`, `dataset.submitted`) and their envelope. A new field, model or
route without a bound fails here. Pure: the routers are built over a stand-in runtime, no server."""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest
from fastapi import FastAPI
from pydantic import BaseModel

from whetstone.contracts import DatasetSubmittedV1, Envelope, JobRequestedV1
from whetstone.contracts.base import MAX_JSON_BYTES_KEY, JsonAtMost

pytestmark = pytest.mark.unit

SERVICES_WITH_API = ("scheduler", "ingest", "registry", "metering", "serving")
EXTERNAL_EVENTS: tuple[type[BaseModel], ...] = (JobRequestedV1, DatasetSubmittedV1, Envelope)
# strings whose format bounds them (the parser refuses anything longer than the format allows)
BOUNDED_FORMATS = frozenset({"date-time", "date", "time", "uuid", "duration"})
# Envelope.payload's values are the typed event its event_type names, validated by that model (walked
# above when external producers may send it; produced by the platform otherwise): its keys are bounded
VALUES_TYPED_ELSEWHERE = frozenset({"Envelope.payload"})


def unbounded(schema: dict[str, Any], defs: dict[str, Any], where: str, seen: set[tuple[str, str]]) -> list[str]:
    """The places under `schema` where a string, array or object has no upper bound."""
    if MAX_JSON_BYTES_KEY in schema:
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if (name, where) in seen:
            return []
        seen.add((name, where))
        return unbounded(defs[name], defs, where, seen)
    out: list[str] = []
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in schema.get(key, []):
            out += unbounded(sub, defs, where, seen)
    if "enum" in schema or "const" in schema:
        return out
    kind = schema.get("type")
    if kind == "string":
        if "maxLength" not in schema and schema.get("format") not in BOUNDED_FORMATS:
            out.append(f"{where}: string without maxLength")
    elif kind == "array":
        if "maxItems" not in schema:
            out.append(f"{where}: array without maxItems")
        for item in ([schema["items"]] if isinstance(schema.get("items"), dict) else []) + schema.get("prefixItems", []):
            out += unbounded(item, defs, f"{where}[]", seen)
    elif kind == "object" or "properties" in schema:
        for name, sub in schema.get("properties", {}).items():
            out += unbounded(sub, defs, f"{where}.{name}", seen)
        extra = schema.get("additionalProperties", "properties" not in schema)
        if extra is not False:
            if "maxProperties" not in schema:
                out.append(f"{where}: object without maxProperties")
            if "maxLength" not in schema.get("propertyNames", {}):
                out.append(f"{where}: object keys without maxLength")
            if where not in VALUES_TYPED_ELSEWHERE:
                if isinstance(extra, dict):
                    out += unbounded(extra, defs, f"{where}{{*}}", seen)
                else:
                    out.append(f"{where}: free-form values without a bound (JsonAtMost)")
    elif kind is None and not any(k in schema for k in ("anyOf", "oneOf", "allOf")):
        out.append(f"{where}: any JSON without a bound (JsonAtMost)")
    return out


def request_bodies() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(where, schema, its definitions) of every JSON request body of every service's routes."""
    found = []
    data_dir = Path(tempfile.mkdtemp(prefix="request-bounds-"))   # where a router may read the internal secret
    for name in SERVICES_WITH_API:
        bootstrap = importlib.import_module(f"whetstone.{name}.bootstrap")
        routes = getattr(bootstrap, "routes", None) or bootstrap.build_service().routes
        runtime = MagicMock(name=f"{name} runtime")
        runtime.settings.data_dir = data_dir
        app = FastAPI()
        app.include_router(routes(runtime))
        doc = app.openapi()
        defs = doc.get("components", {}).get("schemas", {})
        for path, operations in doc["paths"].items():
            for method, op in operations.items():
                for content_type, media in op.get("requestBody", {}).get("content", {}).items():
                    found.append((f"{name} {method.upper()} {path} ({content_type})", media["schema"], defs))
    return found


BODIES = request_bodies()


def test_the_walk_finds_the_request_bodies_it_must_check():
    where = " ".join(w for w, _, _ in BODIES)
    for route in ("scheduler POST /v1/fine_tuning/jobs", "scheduler POST /v1/webhooks", "scheduler POST /v1/keys",
                  "registry POST /v1/models/{model_id}/promote", "serving POST /v1/chat/completions",
                  "serving POST /v1/completions", "metering POST /v1/usage/jobs/{job_id}/review"):
        assert route in where, f"{route} not found among the request bodies walked: {where}"


@pytest.mark.parametrize(("where", "schema", "defs"), BODIES, ids=[w for w, _, _ in BODIES])
def test_every_field_of_every_request_body_is_bounded(where, schema, defs):
    assert unbounded(schema, defs, where, set()) == []


@pytest.mark.parametrize("model", EXTERNAL_EVENTS, ids=lambda m: m.__name__)
def test_every_field_an_external_producer_sends_is_bounded(model):
    schema = model.model_json_schema(mode="validation")
    assert unbounded(schema, schema.get("$defs", {}), model.__name__, set()) == []


def test_the_walk_catches_a_field_without_a_bound():
    class Careless(BaseModel):
        name: str
        tags: list[str]
        extra: dict[str, Any]
        anything: Any = None

    schema = Careless.model_json_schema()
    found = unbounded(schema, schema.get("$defs", {}), "Careless", set())
    assert {f.split(":")[0] for f in found} == {"Careless.name", "Careless.tags", "Careless.tags[]", "Careless.extra",
                                                  "Careless.anything"}


def test_free_form_json_is_refused_past_its_bound():
    from typing import Annotated

    from pydantic import TypeAdapter, ValidationError

    bounded = TypeAdapter(Annotated[dict[str, Any], JsonAtMost(32)])
    assert bounded.validate_python({"a": "x" * 10}) == {"a": "x" * 10}
    with pytest.raises(ValidationError, match="at most 32 bytes of JSON"):
        bounded.validate_python({"a": "x" * 40})
    with pytest.raises(ValidationError, match="training_file"):
        JobRequestedV1(job_id="ftjob-1", idempotency_key="k", model="m", training_file="f" * 60_000)

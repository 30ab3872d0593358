"""Job templates: `POST /v1/templates` (YAML or JSON; a known name makes the next version),
`GET /v1/templates`, `GET /v1/templates/{name}` (latest), `GET /v1/templates/{name}/versions`,
`GET /v1/templates/{name}/versions/{v}`; and `resolve`, which turns a job create naming
`template: "name"` or `"name@3"` into the full create body, recording the overrides."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import yaml
from fastapi import APIRouter, Request
from pydantic import ValidationError
from whetstone.graders import GraderEnvironment
from whetstone.runtime.errors import ApiError, FieldError
from whetstone.runtime.http import ListObject, list_object, not_found as missing
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.models import UnknownModel
from whetstone.runtime.service import Runtime

from ..adapters.templates import TemplateStore
from ..context import SchedulerContext
from ..domain import templates as rules
from ..domain.job_data import TemplateUse
from ..domain.templates import StoredTemplate
from .requests import CreateJob, bad, to_request

Rt = Runtime[SchedulerContext]
MAX_BODY = 64 * 1024
MAX_DEPTH = 20        # a job's deepest field (method.supervised.hyperparameters.x) is 4 levels down
MAX_NODES = 5000
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml where PyYAML was built with it
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")


def invalid(exc: ValidationError) -> ApiError:
    error = FieldError.first_of(exc)
    return bad(error.path or "body", error.message)


def not_found(ref: str) -> ApiError:
    return missing(f"No job template {ref!r}", code="template_not_found", param="template")


def check_yaml_shape(text: str) -> None:
    """Before anything is built: refuse anchors and aliases (a few hundred bytes of nested aliases
    expand to gigabytes once the document is used), explicit tags, nesting deeper than MAX_DEPTH
    and more than MAX_NODES nodes. Reading the events costs time linear in the text: the body cap
    bounds it."""
    depth = nodes = 0
    for event in yaml.parse(text, Loader=SAFE_LOADER):
        where = f" (line {event.start_mark.line + 1})"
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise bad("body", f"YAML anchors and aliases (&, *) are not accepted in a template{where}")
        if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent) and event.tag is not None:
            raise bad("body", f"YAML tags (!...) are not accepted in a template{where}")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise bad("body", f"a template nests at most {MAX_DEPTH} levels deep{where}")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > MAX_NODES:
                raise bad("body", f"a template holds at most {MAX_NODES} values{where}")


def parse_body(raw: bytes, content_type: str) -> Any:
    """Blocking (pure-Python parsing): run it in a thread, never on the event loop."""
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"a template is at most {MAX_BODY} bytes", code="too_large", param="body")
    text = raw.decode("utf-8", errors="strict") if raw else ""
    try:
        if content_type.split(";")[0].strip().lower() in YAML_TYPES:
            check_yaml_shape(text)
            return yaml.load(text, Loader=SAFE_LOADER)   # noqa: S506 (a safe loader)
        return json.loads(text)
    except RecursionError as exc:
        raise bad("body", f"a template nests at most {MAX_DEPTH} levels deep") from exc
    except (yaml.YAMLError, ValueError) as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else \
            f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise bad("body", f"not valid {'YAML' if 'yaml' in content_type else 'JSON'}{line}: {exc}") from exc


def validate(template: rules.TemplateBody, graders: GraderEnvironment, *, mlflow_configured: bool) -> None:
    """The rules of a job create, on the template's fields (a placeholder stands in for the file),
    integrations included: an `mlflow` block passes where the operator configured MLflow, as on a create."""
    try:
        body = CreateJob.model_validate({**template.fields, "training_file": "file-template-check"})
    except ValidationError as exc:
        raise invalid(exc) from exc
    to_request(body, "job-template-check", "template-check", graders, mlflow_configured=mlflow_configured)


async def resolve(rt: Rt, tenant_id: str, body: CreateJob) -> tuple[CreateJob, TemplateUse | None]:
    """A create naming a template -> the create with the template's fields under the call's, and the
    template used (name, version, overrides) the job keeps; a create without one comes back unchanged."""
    if body.template is None:
        return body, None
    try:
        ref = rules.parse_ref(body.template)
    except rules.TemplateError as exc:
        raise bad(exc.param, exc.message) from exc
    async with rt.uow() as uow:
        template = await TemplateStore(uow.conn).get(tenant_id, ref.name, ref.version)
    if template is None:   # another tenant's template is as unknown as a missing one
        raise not_found(body.template)
    call = body.model_dump(exclude_unset=True, exclude={"template"})
    fields, overrides = rules.apply(template.template, call)
    try:
        resolved = CreateJob.model_validate(fields)
    except ValidationError as exc:
        raise invalid(exc) from exc
    return resolved, TemplateUse(name=template.name, version=template.version, overrides=sorted(overrides))


def routes(rt: Rt) -> APIRouter:
    r = APIRouter(prefix="/v1/templates")

    @r.post("")
    async def create(request: Request, caller: Caller = require("write")) -> StoredTemplate:
        parsed = await asyncio.to_thread(parse_body, await request.body(),
                                         request.headers.get("content-type", "application/json"))
        try:
            template = rules.split_body(parsed)
        except rules.TemplateError as exc:
            raise bad(exc.param, exc.message) from exc
        validate(template, rt.ctx.graders, mlflow_configured=rt.ctx.config.mlflow_tracking_uri is not None)
        try:   # the base model must exist, as for a job create (sizes are checked when a job names it)
            await rt.ctx.models.resolve(template.fields["model"], rt.settings.model_catalog)
        except UnknownModel as exc:
            raise ApiError(400, str(exc), code="unknown_base_model", param="model") from exc
        async with rt.uow() as uow:
            return await TemplateStore(uow.conn).add(caller.tenant_id, template, rt.ctx.clock())

    @r.get("")
    async def list_templates(caller: Caller = require("read")) -> ListObject[StoredTemplate]:
        async with rt.uow() as uow:
            data = await TemplateStore(uow.conn).latest(caller.tenant_id)
        return list_object(data)

    @r.get("/{name}")
    async def latest(name: str, caller: Caller = require("read")) -> StoredTemplate:
        async with rt.uow() as uow:
            template = await TemplateStore(uow.conn).get(caller.tenant_id, name)
        if template is None:
            raise not_found(name)
        return template

    @r.get("/{name}/versions")
    async def versions(name: str, caller: Caller = require("read")) -> ListObject[StoredTemplate]:
        async with rt.uow() as uow:
            data = await TemplateStore(uow.conn).versions(caller.tenant_id, name)
        if not data:
            raise not_found(name)
        return list_object(data)

    @r.get("/{name}/versions/{version}")
    async def version(name: str, version: int, caller: Caller = require("read")) -> StoredTemplate:
        async with rt.uow() as uow:
            template = await TemplateStore(uow.conn).get(caller.tenant_id, name, version)
        if template is None:
            raise not_found(f"{name}@{version}")
        return template

    return r

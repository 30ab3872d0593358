"""Base-model catalog and the SHA drift guard (seed 001 "The SHA pinning problem").

Publishing a new SHA for a base marks every live adapter pinned to another SHA `needs_reeval`,
asks eval to re-run the gate against the new SHA (`eval.requested`), and the rollout check says
whether the serving fleet may move (every production adapter passed re-evaluation)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from whetstone.contracts import BaseModelUpdatedV1, EvalCompletedV1, EvalRequestedV1
from whetstone.contracts.enums import EvalReason
from whetstone.runtime.errors import ApiError
from whetstone.runtime.identity import PLATFORM_TENANT
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.store import ModelStore
from ..context import RegistryContext
from ..domain.drift import BaseModelEntry, ReevalStatus, RolloutCheck, reeval_request_id, rollout_check

SHA_RE = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")


@dataclass(frozen=True)
class PublishedVersion:
    name: str
    sha256: str
    previous_sha256: str | None
    needs_reeval: list[str]     # the live models pinned to another SHA
    eval_requested: list[str]   # those asked to pass the gate again by this publication


async def known(store: ModelStore, name: str) -> BaseModelEntry:
    base = await store.base(name)
    if base is None:
        raise ApiError(404, f"The base model '{name}' is not in the catalog", code="base_model_not_found", param="name")
    return base


async def check_rollout(store: ModelStore, name: str) -> RolloutCheck:
    base = await known(store, name)
    return rollout_check(name, base.sha256, base.previous_sha256, await store.production_adapters(name, base.sha256))


async def publish_version(uow: UnitOfWork, store: ModelStore, name: str, sha256: str, uri: str | None, reason: str,
                          actor: str) -> PublishedVersion:
    """The one way a new SHA enters the catalog (the admin route and the CLI call this)."""
    if not SHA_RE.match(sha256):
        raise ApiError(400, "sha256 must be 64 (or 40) lowercase hex characters", code="invalid_sha256", param="sha256")
    current = await store.base(name, for_update=True)
    previous = current.sha256 if current else None
    if previous == sha256:
        raise ApiError(409, f"{name} is already pinned at {sha256}", code="already_current", param="sha256")
    if any(v.sha256 == sha256 for v in await store.base_versions(name)):
        raise ApiError(409, f"{sha256} was published for {name} before; publish a new revision", code="sha_reused",
                       param="sha256")
    await store.publish_base_version(name, sha256, previous, uri, reason, actor)
    affected = await store.pinned_elsewhere(name, sha256)
    await store.mark_needs_reeval([m.model_id for m in affected])
    requested = []
    for m in affected:
        request_id = reeval_request_id(m.model_id, sha256)
        if not await store.add_reeval(request_id, m.model_id, name, sha256):
            continue
        await uow.publish(EvalRequestedV1(
            request_id=request_id, job_id=m.job_id, model_id=m.model_id, checkpoint_uri=m.artifact_uri,
            manifest_sha256=m.artifact_sha256, base_model=name, base_model_sha256=sha256, base_model_uri=uri,
            previous_base_model_sha256=m.lineage.base_model_sha256 if m.lineage else None,
            reason=EvalReason.BASE_MODEL_UPDATED), tenant_id=m.tenant_id)
        requested.append(m.model_id)
    await uow.publish(BaseModelUpdatedV1(name=name, sha256=sha256, previous_sha256=previous, uri=uri, reason=reason),
                      tenant_id=PLATFORM_TENANT)
    return PublishedVersion(name, sha256, previous, [m.model_id for m in affected], requested)


async def reeval_completed(rt: Runtime[RegistryContext], store: ModelStore, ev: EvalCompletedV1) -> None:
    """eval's answer to a re-evaluation: a pass against the base's current SHA clears `needs_reeval`."""
    request = await store.reeval(ev.request_id or "")
    if request is None or request.status != ReevalStatus.REQUESTED:
        rt.log.warning("eval answer for an unknown or finished re-evaluation", request_id=ev.request_id)
        return
    base = await store.base(request.base_model)
    still_current = base is not None and base.sha256 == request.base_model_sha256
    await store.complete_reeval(request.request_id, request.model_id, ReevalStatus(ev.verdict), list(ev.reasons),
                                still_current)

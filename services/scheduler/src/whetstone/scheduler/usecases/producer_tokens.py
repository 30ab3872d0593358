"""Who may put a job on the bus: `job.requested` from outside the platform is trusted only with a
platform-signed producer token for the envelope's tenant.

The token travels in the envelope (`producer_token`, a plain JSON field any Kafka producer can set).
A token is valid only while its signed expiry has not passed and while the scheduler has a record of
issuing it and has not revoked it (a token signed with the platform's secret but never recorded is
refused: fail closed). Refusals are dead letters with one of the reasons below, counted in `whetstone_refused_total{reason}`.

A job id is `job_id_for(tenant, idempotency_key)`: a `job.requested` whose job id is not the one its
own tenant and key give is refused (`tenant_mismatch`), so no producer, even with a valid token of
its own, can claim a job id another tenant has used or will use (a pre-claim).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from whetstone.contracts import Envelope, job_id_for
from whetstone.runtime.identity import (
    PRODUCER_TOKEN_PREFIX,
    internal_secret,
    verify_producer_token,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.service import Runtime

from ..adapters.keys import producer_token_status


class JobClaim(BaseModel):
    """The two fields of a `job.requested` payload that say whose job id it claims (read before the
    payload is validated whole: ids of the wrong type read as absent)."""

    model_config = ConfigDict(extra="ignore")
    job_id: str | None = None
    idempotency_key: str | None = None

    @classmethod
    def of(cls, payload: object) -> JobClaim:
        try:
            return cls.model_validate(payload)
        except ValidationError:
            return cls()


async def check_producer_token(rt: Runtime[Any], uow: UnitOfWork, env: Envelope) -> str:
    """The token's id when `env` carries a valid, unrevoked token for its own tenant; raises
    `PoisonMessage` (producer_token_missing|forged|expired|unknown|revoked|tenant_mismatch, or
    tenant_mismatch for a job id that is not the tenant's) otherwise."""
    token = env.producer_token
    if not token:
        raise PoisonMessage(f"{env.event_type} without a producer token (envelope field `producer_token`; "
                            "issue one with `whet keys create-producer TENANT`)", reason="producer_token_missing")
    verified = verify_producer_token(token, internal_secret(rt.settings.data_dir))
    if verified is None:
        shown = token[:len(PRODUCER_TOKEN_PREFIX) + 16] if token.startswith(PRODUCER_TOKEN_PREFIX) else "(not whp_)"
        raise PoisonMessage(f"{env.event_type}: producer token {shown}… is not signed by this platform",
                            reason="producer_token_forged")
    token_id, tenant = verified.token_id, verified.tenant_id
    if verified.expired(time.time()):
        raise PoisonMessage(f"{env.event_type}: producer token {token_id} expired at {verified.expires_at} (unix s); "
                            "issue a new one with `whet keys create-producer TENANT`", reason="producer_token_expired")
    status = await producer_token_status(uow.conn, token_id)
    if status == "unknown":
        raise PoisonMessage(f"{env.event_type}: producer token {token_id} was never issued by this platform's "
                            "scheduler", reason="producer_token_unknown")
    if status == "revoked":
        raise PoisonMessage(f"{env.event_type}: producer token {token_id} was revoked", reason="producer_token_revoked")
    if tenant != env.tenant_id:
        raise PoisonMessage(f"{env.event_type}: producer token {token_id} is tenant {tenant!r}'s, the envelope names "
                            f"{env.tenant_id!r}", reason="producer_token_tenant_mismatch")
    claim = JobClaim.of(env.payload)
    if env.event_type == "job.requested" and (
            claim.idempotency_key is None or claim.job_id != job_id_for(tenant, claim.idempotency_key)):
        raise PoisonMessage(f"job.requested: job id {str(claim.job_id)[:64]!r} is not tenant {tenant!r}'s for the idempotency "
                            "key given (job ids are job_id_for(tenant, idempotency_key))", reason="tenant_mismatch")
    return token_id

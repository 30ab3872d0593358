"""Who may put a job on the bus: `job.requested` from outside the platform is trusted only with a
platform-signed producer token for the envelope's tenant (issue 20, point 4).

The token travels in the envelope (`producer_token`, a plain JSON field any Kafka producer can set).
Refusals are dead letters with one of the reasons below, counted in `whetstone_refused_total{reason}`.
"""

from __future__ import annotations

from whetstone.contracts import Envelope
from whetstone.runtime.identity import (
    PRODUCER_TOKEN_PREFIX,
    internal_secret,
    verify_producer_token,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import PoisonMessage, Runtime

from .adapters.keys import producer_token_revoked


async def check_producer_token(rt: Runtime, uow: UnitOfWork, env: Envelope) -> str:
    """The token's id when `env` carries a valid, unrevoked token for its own tenant; raises
    `PoisonMessage` (producer_token_missing|forged|revoked|tenant_mismatch) otherwise."""
    token = env.producer_token
    if not token:
        raise PoisonMessage(f"{env.event_type} without a producer token (envelope field `producer_token`; "
                            "issue one with `whet keys create-producer TENANT`)", reason="producer_token_missing")
    verified = verify_producer_token(token, internal_secret(rt.settings.data_dir))
    if verified is None:
        shown = token[:len(PRODUCER_TOKEN_PREFIX) + 16] if token.startswith(PRODUCER_TOKEN_PREFIX) else "(not whp_)"
        raise PoisonMessage(f"{env.event_type}: producer token {shown}… is not signed by this platform",
                            reason="producer_token_forged")
    token_id, tenant = verified
    if await producer_token_revoked(uow.conn, token_id):
        raise PoisonMessage(f"{env.event_type}: producer token {token_id} was revoked", reason="producer_token_revoked")
    if tenant != env.tenant_id:
        raise PoisonMessage(f"{env.event_type}: producer token {token_id} is tenant {tenant!r}'s, the envelope names "
                            f"{env.tenant_id!r}", reason="producer_token_tenant_mismatch")
    return token_id

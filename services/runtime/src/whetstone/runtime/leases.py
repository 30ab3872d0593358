"""Long work claimed from a table under a lease (eval's `eval_runs`, ingest's `validations`).

The table has a key column and `status` ('pending' | 'running' | ...), `lease_owner`, `lease_until`,
`attempts`, `not_before`, `created_at` and `updated_at`. A worker claims the oldest due row (or one
whose lease ran out: its worker died), renews the lease while it works with no transaction open,
and records the result in one short transaction that checks it still owns the row. Claims by
several workers or replicas never collide (`FOR UPDATE SKIP LOCKED`); attempts are counted when a
row is claimed, so work that kills its process is not retried forever."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg


@dataclass(frozen=True)
class LeasedTable:
    table: str
    key: str                   # the primary-key column

    async def claim_next(self, pool: asyncpg.Pool, owner: str, lease_s: float,
                         returning: str) -> asyncpg.Record | None:
        """The oldest pending row that is due, or a running one whose lease ran out: now `owner`'s."""
        return await pool.fetchrow(
            f"UPDATE {self.table} SET status = 'running', lease_owner = $1, attempts = attempts + 1,"
            " lease_until = now() + make_interval(secs => $2), updated_at = now()"
            f" WHERE {self.key} = (SELECT {self.key} FROM {self.table}"
            "   WHERE (status = 'pending' AND (not_before IS NULL OR not_before <= now()))"
            "      OR (status = 'running' AND lease_until < now())"
            f"   ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING {returning}", owner, lease_s)

    async def renew(self, pool: asyncpg.Pool, key: str, owner: str, lease_s: float) -> bool:
        status: str = await pool.execute(
            f"UPDATE {self.table} SET lease_until = now() + make_interval(secs => $3), updated_at = now()"
            f" WHERE {self.key} = $1 AND lease_owner = $2 AND status = 'running'", key, owner, lease_s)
        return status.endswith(" 1")

    async def keep_renewed(self, pool: asyncpg.Pool, key: str, owner: str, lease_s: float,
                           on_lost: Callable[[], None]) -> None:
        """Run beside the work (cancel it when the work ends): renews every third of the lease; a failed
        renewal (the database away for a moment) is tried again at the next one."""
        while True:
            await asyncio.sleep(lease_s / 3)
            with contextlib.suppress(Exception):
                if not await self.renew(pool, key, owner, lease_s):
                    on_lost()
                    return


async def wait_for_work(wakeup: asyncio.Event, poll_s: float) -> None:
    """Idle until `wakeup` is set (a handler queued work and committed) or `poll_s` passed."""
    wakeup.clear()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wakeup.wait(), timeout=poll_s)

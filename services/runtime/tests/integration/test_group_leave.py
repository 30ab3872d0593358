"""A service that stops leaves its consumer group, whatever the generation it joined in
(runtime/membership.py): on the dev broker a group's first generation is 0, which aiokafka's own
stop does not leave, and the group then keeps a member nobody runs, so a rewind of its offsets from
outside the group is refused and the next member's join waits for that session to expire."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from whetstone.devstack.testing import group_members
from whetstone.runtime.membership import GroupMember
from whetstone.runtime.service import Service

pytestmark = pytest.mark.integration


async def test_a_stopped_service_is_no_longer_a_member_of_its_group(settings, platform):
    name = f"leaver-{uuid.uuid4().hex[:8]}"  # a new group: its first generation

    def leaver() -> Service:
        async def handler(rt, uow, env, ev):
            return None

        return Service(name=name, subscriptions={"job.progress": handler})

    async with platform(leaver) as p:
        rt = p[name]
        deadline = time.monotonic() + 60
        while rt.assigned_partitions() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        member = GroupMember.of(rt._kafka_consumer())
        assert member is not None
        assert await group_members(settings.kafka_bootstrap, rt.consumer) == [member.member_id]
    assert await group_members(settings.kafka_bootstrap, rt.consumer) == []

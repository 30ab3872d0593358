"""Leaving a consumer group when a member of its generation 0 stops.

aiokafka's consumer sends LeaveGroup on stop only when its generation is above 0: Kafka numbers a
group's generations from 1, so 0 means "never joined" to the client. The dev broker (Tansu) numbers
them from 0, so the members of a group's first generation stop without leaving, and the broker keeps
them until a join makes it expire their sessions: until then the group is not Empty, another member's
join waits for theirs to time out, and an offset commit made outside the group (generation -1, as a
tool resetting the group's offsets makes) is refused with UNKNOWN_MEMBER_ID.

`GroupMember.of(consumer)` notes who the consumer is in its group while it runs; once it has stopped,
`leave(member, ...)` sends the LeaveGroup that aiokafka left out, on a connection of its own (the
consumer's is closed by then, and sending it before the stop would race its heartbeats and commits).
A static member (group.instance.id) keeps its place on purpose and is never made to leave."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.errors import for_code
from aiokafka.protocol.group import LeaveGroupRequest

from .logging import get_logger

log = get_logger("whetstone.membership")


@dataclass(frozen=True)
class GroupMember:
    group_id: str
    member_id: str
    generation: int

    @staticmethod
    def of(consumer: Any) -> GroupMember | None:
        """Who this aiokafka consumer is in its group now; None if it is in none, or is a static member."""
        coordinator = getattr(consumer, "_coordinator", None)
        if coordinator is None or getattr(coordinator, "_group_instance_id", None) is not None:
            return None
        if not coordinator.member_id or coordinator.generation < 0:
            return None
        return GroupMember(coordinator.group_id, coordinator.member_id, coordinator.generation)

    @property
    def left_by_client(self) -> bool:
        """Whether aiokafka's own stop sends this member's LeaveGroup (only above generation 0)."""
        return self.generation > 0


async def ask_coordinator(bootstrap: str, group_id: str, request: Any, **client_options: Any) -> Any:
    """Send one request to the coordinator of `group_id`, on a connection of its own; its response."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, **client_options)
    await client.bootstrap()
    try:
        node = await client.coordinator_lookup(CoordinationType.GROUP, group_id)
        return await client.send(node, request)
    finally:
        await client.close()


async def leave(member: GroupMember, bootstrap: str, **client_options: Any) -> None:
    """Send the LeaveGroup of a stopped member (see the module docstring). Raises the broker's error."""
    response = await ask_coordinator(bootstrap, member.group_id,
                                     LeaveGroupRequest(member.group_id, member.member_id), **client_options)
    if response.error_code:
        raise for_code(response.error_code)(f"LeaveGroup of {member.member_id} from {member.group_id}")
    log.info("left consumer group", group=member.group_id, member=member.member_id, generation=member.generation)

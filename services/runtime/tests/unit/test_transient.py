"""Which handler failures are a dependency's (retried for minutes) and which the message's (counted)."""

import asyncpg
import pytest
from botocore.exceptions import EndpointConnectionError

from whetstone.runtime.delivery import dead_letter, is_transient

pytestmark = pytest.mark.unit


def test_dependency_failures_are_transient_and_bugs_are_not():
    assert is_transient(ConnectionRefusedError("postgres down"))
    assert is_transient(asyncpg.exceptions.CannotConnectNowError("starting up"))
    assert is_transient(EndpointConnectionError(endpoint_url="http://s3"))
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError as inner:
            raise RuntimeError("upload failed") from inner
    except RuntimeError as wrapped:
        assert is_transient(wrapped)
    assert not is_transient(RuntimeError("handler bug"))
    assert not is_transient(KeyError("missing field"))


def test_a_dead_letter_is_bounded_and_keeps_size_and_hash():
    big_text = ("é" * 40_000).encode()  # 80 KB of two-byte characters: the cut falls inside one
    letter = dead_letter("job.requested", 0, 7, "scheduler", 3, "boom", "k" * 5000, big_text)
    assert letter.value_encoding == "utf-8" and letter.value_truncated and letter.value_bytes == 80_000
    assert len(letter.value.encode()) <= 64 * 1024 and len(letter.key) == 1000
    binary = dead_letter("job.requested", 0, 8, "scheduler", 1, "bad", None, b"\xff\xfe\x00" * 10)
    assert binary.value_encoding == "base64" and not binary.value_truncated
    empty = dead_letter("job.requested", 0, 9, "scheduler", 1, "tombstone", None, b"")
    assert empty.value == "" and empty.value_bytes == 0

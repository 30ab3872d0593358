"""Dead letters keep no credential: a producer token's MAC and an API key's
secret are redacted; the token id and key id stay, so an operator can still tell which it was."""

import hashlib

import pytest
from whetstone.runtime.delivery import dead_letter
from whetstone.runtime.identity import mint_producer_token

pytestmark = pytest.mark.unit


def test_tokens_and_keys_are_redacted_in_dead_letters():
    token = mint_producer_token("demo", b"s" * 32)
    key = "wsk-0123456789ab-" + "f" * 48
    raw = f'{{"event_type":"job.requested","producer_token":"{token}","payload":{{"suffix":"{key}"}}}}'.encode()
    letter = dead_letter("job.requested", 0, 1, "scheduler", 1, f"bad token {token}", None, raw)
    assert token not in letter.value and token not in letter.error and "f" * 48 not in letter.value
    assert token.rsplit(".", 1)[0] + ".[redacted]" in letter.value and "wsk-0123456789ab-[redacted]" in letter.value
    assert letter.value_sha256 == hashlib.sha256(raw).hexdigest() and letter.value_bytes == len(raw)

"""What a service derives from a received request to check a signature against (runtime.signing):
the body must match its declared hash, and the `UNSIGNED-PAYLOAD` marker holds only for a body that
is really streamed (chunked, or over 1 MiB). Pure: ASGI scopes, no server."""

import hashlib

import httpx
import pytest
from starlette.requests import Request

from whetstone.runtime.identity import IDENTITY_HEADER, SIGNATURE_HEADER, IdentityAuth, verify
from whetstone.runtime.signing import CONTENT_HASH_HEADER, UNSIGNED_PAYLOAD, Bound, bound_of

pytestmark = pytest.mark.unit


def received(method: str, raw_path: bytes, query: bytes, headers: dict[str, str], body: bytes) -> Request:
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": method, "path": raw_path.decode(), "raw_path": raw_path, "query_string": query,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    return Request(scope, receive)


async def test_the_binding_is_the_received_method_target_and_body():
    body = b'{"suffix": "x"}'
    got = await bound_of(received("POST", b"/v1/a%2Fb", b"limit=2", {CONTENT_HASH_HEADER: hashlib.sha256(body).hexdigest()},
                                  body))
    assert got == Bound.of("POST", "/v1/a%2Fb?limit=2", body)


async def test_a_body_that_differs_from_its_declared_hash_binds_nothing():
    declared = hashlib.sha256(b'{"suffix": "x"}').hexdigest()
    assert await bound_of(received("POST", b"/v1/a", b"", {CONTENT_HASH_HEADER: declared}, b'{"suffix": "y"}')) is None
    assert await bound_of(received("POST", b"/v1/a", b"", {}, b"{}")) is None                  # no declared hash


@pytest.mark.parametrize(("headers", "accepted"), [
    ({"transfer-encoding": "chunked"}, True),
    ({"content-length": str(2 << 20)}, True),
    ({"content-length": "100"}, False),      # a small body could have been hashed: the marker is refused
    ({}, False),
])
async def test_an_unsigned_body_is_accepted_only_when_streamed(headers, accepted):
    got = await bound_of(received("POST", b"/v1/files", b"", {CONTENT_HASH_HEADER: UNSIGNED_PAYLOAD, **headers}, b""))
    assert (got == Bound("POST", "/v1/files", UNSIGNED_PAYLOAD)) is accepted


async def test_what_the_httpx_auth_signs_a_service_verifies():
    secret = b"k" * 32
    request = httpx.Request("POST", "http://svc/v1/fine_tuning/jobs?x=%20y", json={"model": "m", "suffix": "é"})
    signed = next(IdentityAuth("acme", ("write",), secret=secret).auth_flow(request))
    headers = dict(signed.headers)
    got = await bound_of(received("POST", b"/v1/fine_tuning/jobs", b"x=%20y", headers, signed.content))
    who = verify(headers[IDENTITY_HEADER.lower()], headers[SIGNATURE_HEADER.lower()], secret, got)
    assert who.tenant_id == "acme"

"""The signed caller identity, internal calls, producer tokens and OpenAI-shaped errors (pure: no server)."""

import pytest

from whetstone.runtime.errors import ApiError
from whetstone.runtime.identity import (
    IDENTITY_HEADER,
    INTERNAL_HEADER,
    SIGNATURE_HEADER,
    IdentityKeys,
    identity_headers,
    identity_keys,
    internal_headers,
    verify,
    verify_internal,
)
from whetstone.runtime.signing import UNSIGNED_PAYLOAD, Bound, canonical

pytestmark = pytest.mark.unit
SECRET = b"s3cret"
POST = Bound.of("POST", "/v1/fine_tuning/jobs", b'{"model":"m"}')


def test_a_signed_identity_verifies_and_carries_tenant_and_scopes():
    h = identity_headers("acme", ("read", "write"), bound=POST, key_id="k1", secret=SECRET, now=1000)
    who = verify(h[IDENTITY_HEADER], h[SIGNATURE_HEADER], SECRET, POST, now=1010)
    assert (who.tenant_id, who.key_id, who.scopes) == ("acme", "k1", frozenset({"read", "write"}))
    assert who.allows("read") and who.allows("write") and not who.allows("admin")
    assert not who.allows("models:promote")


@pytest.mark.parametrize("tamper", ["tenant", "scopes", "secret", "missing", "expired", "from the future",
                                    "other path", "other query", "other method", "other body", "unsigned body",
                                    "body mismatch"])
def test_a_forged_stale_or_moved_identity_is_refused(tamper):
    h = identity_headers("acme", ("read",), bound=POST, secret=SECRET, now=1000)
    identity, signature, secret, now, bound = h[IDENTITY_HEADER], h[SIGNATURE_HEADER], SECRET, 1000, POST
    match tamper:
        case "tenant":
            identity = identity.replace("tenant=acme", "tenant=demo")
        case "scopes":
            identity = identity.replace("scopes=read", "scopes=admin,read")
        case "secret":
            secret = b"other"
        case "missing":
            signature = None
        case "expired":
            now = 1000 + 61          # a replay just past the 60 s window
        case "from the future":
            now = 1000 - 61
        case "other path":
            bound = Bound.of("POST", "/v1/fine_tuning/jobs/ftjob-1/cancel", b'{"model":"m"}')
        case "other query":
            bound = Bound.of("POST", "/v1/fine_tuning/jobs?tenant=demo", b'{"model":"m"}')
        case "other method":
            bound = Bound.of("PUT", "/v1/fine_tuning/jobs", b'{"model":"m"}')
        case "other body":
            bound = Bound.of("POST", "/v1/fine_tuning/jobs", b'{"model":"n"}')
        case "unsigned body":
            bound = Bound("POST", "/v1/fine_tuning/jobs", UNSIGNED_PAYLOAD)
        case "body mismatch":
            bound = None             # what the service derives when the body differs from its declared hash
    with pytest.raises(ApiError) as err:
        verify(identity, signature, secret, bound, now=now)
    assert err.value.status == 401
    assert err.value.body()["error"]["code"] in ("invalid_identity", "invalid_api_key")


def test_the_window_is_sixty_seconds_either_side():
    h = identity_headers("acme", ("read",), bound=POST, secret=SECRET, now=1000)
    for now in (940, 1060):
        assert verify(h[IDENTITY_HEADER], h[SIGNATURE_HEADER], SECRET, POST, now=now).tenant_id == "acme"


def test_an_internal_call_is_bound_to_its_request_and_window():
    value = internal_headers(POST, SECRET, now=1000)[INTERNAL_HEADER]
    assert verify_internal(value, SECRET, POST, now=1030)
    assert not verify_internal(value, SECRET, POST, now=1061)                               # replayed too late
    assert not verify_internal(value, SECRET, Bound.of("POST", "/v1/keys", b'{"model":"m"}'), now=1000)
    assert not verify_internal(value, SECRET, Bound.of("DELETE", "/v1/fine_tuning/jobs", b'{"model":"m"}'), now=1000)
    assert not verify_internal(value, SECRET, Bound.of("POST", "/v1/fine_tuning/jobs", b"{}"), now=1000)
    assert not verify_internal(value, SECRET, None, now=1000)
    assert not verify_internal(value, b"other", POST, now=1000)
    ts, _, mac = value.partition(":")
    assert not verify_internal(f"{int(ts) + 30}:{mac}", SECRET, POST, now=1000)            # the time re-stamped


def test_admin_allows_everything_and_errors_say_do_not_retry():
    h = identity_headers("ops", ("admin",), bound=POST, secret=SECRET)
    who = verify(h[IDENTITY_HEADER], h[SIGNATURE_HEADER], SECRET, POST)
    assert who.allows("models:promote") and who.allows("write")
    e = ApiError(409, "conflict", code="idempotency_conflict", param="Idempotency-Key")
    assert e.headers["x-should-retry"] == "false"
    assert e.body() == {"error": {"message": "conflict", "type": "invalid_request_error",
                                  "param": "Idempotency-Key", "code": "idempotency_conflict"}}
    assert "x-should-retry" not in ApiError(503, "busy", type="server_error").headers


def test_a_producer_token_names_its_tenant_and_expiry_and_cannot_be_edited_or_forged():
    from whetstone.runtime.identity import ProducerToken, mint_producer_token, verify_producer_token

    secret = b"platform"
    token = mint_producer_token("demo", secret, token_id="0123456789abcdef", expires_at=2_000_000_000)
    assert token.startswith("whp_0123456789abcdef.demo.2000000000.")
    claims = ProducerToken("0123456789abcdef", "demo", 2_000_000_000)
    assert verify_producer_token(token, secret) == claims
    assert verify_producer_token(f" {token}\n", secret) == claims
    assert not claims.expired(1_999_999_999) and claims.expired(2_000_000_000)
    assert verify_producer_token(token.replace(".demo.", ".acme."), secret) is None      # another tenant
    assert verify_producer_token(token.replace(".2000000000.", ".2999999999."), secret) is None   # a later expiry
    assert verify_producer_token(token, b"other secret") is None                           # not this platform's
    assert verify_producer_token(mint_producer_token("demo", b"other secret"), secret) is None
    assert verify_producer_token(token[:-1] + ("0" if token[-1] != "0" else "1"), secret) is None
    for junk in ("", "whp_", "wsk-0123456789ab-" + "0" * 48, token + ".x", "whp_XYZ.demo.1." + "0" * 32,
                 "whp_0123456789abcdef.demo." + "0" * 32):
        assert verify_producer_token(junk, secret) is None
    with pytest.raises(ValueError):
        mint_producer_token("no spaces allowed", secret)
    default = verify_producer_token(mint_producer_token("demo", secret, now=1000), secret)
    assert default is not None and default.expires_at == 1000 + 90 * 86400


@pytest.mark.parametrize("identity, expect", [
    ("tenant=acme;key=k1;ts=1000", ("acme", "k1", frozenset())),                       # no scopes: none
    ("tenant=acme;scopes=read,,write;ts=1000", ("acme", "", frozenset({"read", "write"}))),
    ("tenant=a;tenant=b;ts=1000", ("b", "", frozenset())),                             # the last one written
    ("key=k1;scopes=read;ts=1000", None),                                              # no tenant
    ("tenant=acme;scopes=read", None),                                                 # no timestamp
    ("tenant=acme;ts=soon", None),                                                     # not a number
])
def test_the_identity_fields_are_read_once_and_a_malformed_one_is_refused(identity, expect):
    signature = IdentityKeys.from_secret(SECRET).sign(canonical("identity", identity, POST))
    if expect is None:
        with pytest.raises(ApiError, match="Malformed identity header"):
            verify(identity, signature, SECRET, POST, now=1000)
        return
    who = verify(identity, signature, SECRET, POST, now=1000)
    assert (who.tenant_id, who.key_id, who.scopes) == expect


def test_a_service_with_only_the_public_key_verifies_but_cannot_sign(monkeypatch, tmp_path):
    """The internal secret stays with the gateway and the scheduler: a service given the public key
    (WHETSTONE_IDENTITY_PUBLIC_KEY) verifies identities and internal calls without ever reading it."""
    public = IdentityKeys.from_secret(SECRET).public_hex()
    assert len(public) == 64 and public != IdentityKeys.from_secret(b"other").public_hex()
    monkeypatch.delenv("WHETSTONE_INTERNAL_SECRET", raising=False)
    monkeypatch.setenv("WHETSTONE_IDENTITY_PUBLIC_KEY", public)
    keys = identity_keys(tmp_path)
    assert keys.private is None and not (tmp_path / "internal.secret").exists()   # no secret read or made
    h = identity_headers("acme", ("read",), bound=POST, secret=SECRET, now=1000)
    assert verify(h[IDENTITY_HEADER], h[SIGNATURE_HEADER], keys, POST, now=1000).tenant_id == "acme"
    assert verify_internal(internal_headers(POST, SECRET, now=1000)[INTERNAL_HEADER], keys, POST, now=1000)
    forged = identity_headers("acme", ("read",), bound=POST, secret=b"a guess", now=1000)
    with pytest.raises(ApiError, match="could not be verified"):
        verify(forged[IDENTITY_HEADER], forged[SIGNATURE_HEADER], keys, POST, now=1000)
    with pytest.raises(PermissionError):
        identity_headers("acme", ("read",), bound=POST, secret=keys, now=1000)
    monkeypatch.setenv("WHETSTONE_IDENTITY_PUBLIC_KEY", "not hex")
    with pytest.raises(ValueError, match="WHETSTONE_IDENTITY_PUBLIC_KEY"):
        identity_keys(tmp_path)

"""The signed caller identity and OpenAI-shaped errors (pure: no server)."""

import pytest

from whetstone.runtime.errors import ApiError
from whetstone.runtime.identity import IDENTITY_HEADER, SIGNATURE_HEADER, identity_headers, verify

pytestmark = pytest.mark.unit
SECRET = b"s3cret"


def test_a_signed_identity_verifies_and_carries_tenant_and_scopes():
    h = identity_headers("acme", ("read", "write"), key_id="k1", secret=SECRET, now=1000)
    who = verify(h[IDENTITY_HEADER], h[SIGNATURE_HEADER], SECRET, now=1010)
    assert (who.tenant_id, who.key_id, who.scopes) == ("acme", "k1", frozenset({"read", "write"}))
    assert who.allows("read") and who.allows("write") and not who.allows("admin")
    assert not who.allows("models:promote")


@pytest.mark.parametrize("tamper", ["tenant", "scopes", "secret", "missing", "expired"])
def test_a_forged_or_stale_identity_is_refused(tamper):
    h = identity_headers("acme", ("read",), secret=SECRET, now=1000)
    identity, signature, secret, now = h[IDENTITY_HEADER], h[SIGNATURE_HEADER], SECRET, 1000
    if tamper == "tenant":
        identity = identity.replace("tenant=acme", "tenant=demo")
    elif tamper == "scopes":
        identity = identity.replace("scopes=read", "scopes=admin,read")
    elif tamper == "secret":
        secret = b"other"
    elif tamper == "missing":
        signature = None
    else:
        now = 1000 + 3600
    with pytest.raises(ApiError) as err:
        verify(identity, signature, secret, now=now)
    assert err.value.status == 401
    assert err.value.body()["error"]["code"] in ("invalid_identity", "invalid_api_key")


def test_admin_allows_everything_and_errors_say_do_not_retry():
    who = verify(*identity_headers("ops", ("admin",), secret=SECRET).values(), SECRET)
    assert who.allows("models:promote") and who.allows("write")
    e = ApiError(409, "conflict", code="idempotency_conflict", param="Idempotency-Key")
    assert e.headers["x-should-retry"] == "false"
    assert e.body() == {"error": {"message": "conflict", "type": "invalid_request_error",
                                  "param": "Idempotency-Key", "code": "idempotency_conflict"}}
    assert "x-should-retry" not in ApiError(503, "busy", type="server_error").headers


def test_a_producer_token_names_its_tenant_and_cannot_be_edited_or_forged():
    from whetstone.runtime.identity import mint_producer_token, verify_producer_token

    secret = b"platform"
    token = mint_producer_token("demo", secret, token_id="0123456789abcdef")
    assert token.startswith("whp_0123456789abcdef.demo.") and len(token) == len("whp_") + 16 + 1 + 4 + 1 + 32
    assert verify_producer_token(token, secret) == ("0123456789abcdef", "demo")
    assert verify_producer_token(f" {token}\n", secret) == ("0123456789abcdef", "demo")
    assert verify_producer_token(token.replace(".demo.", ".acme."), secret) is None      # another tenant
    assert verify_producer_token(token, b"other secret") is None                           # not this platform's
    assert verify_producer_token(mint_producer_token("demo", b"other secret"), secret) is None
    assert verify_producer_token(token[:-1] + ("0" if token[-1] != "0" else "1"), secret) is None
    for junk in ("", "whp_", "wsk-0123456789ab-" + "0" * 48, token + ".x", "whp_XYZ.demo." + "0" * 32):
        assert verify_producer_token(junk, secret) is None
    with pytest.raises(ValueError):
        mint_producer_token("no spaces allowed", secret)

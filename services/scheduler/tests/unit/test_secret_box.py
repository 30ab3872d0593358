"""Webhook signing secrets sealed at rest (adapters/secret_box.py): what is stored opens only with
this platform's key and only on its own webhook's row; a secret stored before encryption still opens."""

import base64

import pytest

from whetstone.scheduler.adapters.secret_box import SecretBox, SecretUnreadable

pytestmark = pytest.mark.unit


def test_a_sealed_secret_opens_only_with_its_key_and_its_webhook():
    box = SecretBox.from_internal_secret(b"platform-secret")
    sealed = box.seal("whsec_abc", "wh_1")
    assert sealed.startswith("enc:v1:") and "whsec_abc" not in sealed and SecretBox.sealed(sealed)
    assert sealed != box.seal("whsec_abc", "wh_1")                        # a fresh nonce each time
    assert box.open(sealed, "wh_1") == "whsec_abc"
    with pytest.raises(SecretUnreadable):
        box.open(sealed, "wh_2")                                           # copied onto another webhook's row
    with pytest.raises(SecretUnreadable):
        SecretBox.from_internal_secret(b"another platform").open(sealed, "wh_1")
    raw = bytearray(base64.urlsafe_b64decode(sealed[len("enc:v1:"):]))
    raw[20] ^= 1                                                          # one bit of the ciphertext
    for altered in ("enc:v1:" + base64.urlsafe_b64encode(bytes(raw)).decode(), "enc:v1:not base64!"):
        with pytest.raises(SecretUnreadable):
            box.open(altered, "wh_1")


def test_a_secret_stored_before_encryption_still_opens_as_itself():
    box = SecretBox.from_internal_secret(b"platform-secret")
    assert box.open("whsec_legacy", "wh_1") == "whsec_legacy" and not SecretBox.sealed("whsec_legacy")

"""Tenant boundaries that need no database: object URIs under a tenant's prefix, platform-only topics
(the owner checks against Postgres run in tests/integration/test_cross_tenant.py)."""

import pytest
from whetstone.contracts import BaseModelUpdatedV1
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.messaging import make_envelope
from whetstone.runtime.s3 import within_tenant
from whetstone.runtime.tenancy import check_tenant

pytestmark = pytest.mark.unit


def test_an_object_is_a_tenants_only_under_its_prefix():
    assert within_tenant("s3://whetstone/tenants/demo/datasets/ds-1/train.jsonl", "demo")
    assert within_tenant("s3://whetstone/tenants/demo/x", "demo", "whetstone")
    assert not within_tenant("s3://whetstone/tenants/demo/x", "demo", "other-bucket")
    assert not within_tenant("s3://whetstone/tenants/demo/x", "acme")
    assert not within_tenant("s3://whetstone/tenants/demox/x", "demo")          # a prefix, not a substring
    assert not within_tenant("s3://whetstone/tenants/demo/../acme/x", "demo")
    for bad in ("", "s3://", "s3://whetstone", "https://whetstone/tenants/demo/x", "tenants/demo/x"):
        assert not within_tenant(bad, "demo")
    assert not within_tenant("s3://whetstone/tenants/a b/x", "a b")            # not a tenant id at all


async def test_only_the_platform_speaks_for_base_models():
    event = BaseModelUpdatedV1(name="tiny-llama", sha256="ab" * 32)
    await check_tenant(None, "base_model.updated", make_envelope(event, producer="registry", tenant_id="platform"),
                       event)
    with pytest.raises(PoisonMessage) as refused:
        await check_tenant(None, "base_model.updated", make_envelope(event, producer="x", tenant_id="acme"), event)
    assert refused.value.reason == "tenant_mismatch"

"""Services refuse to start with the dev stack's default S3 credentials anywhere but on the dev
stack's loopback object store."""

import pytest
from whetstone.runtime.settings import CommonSettings, check_credentials

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("endpoint", ["http://minio.storage:9000", "https://s3.eu-west-1.amazonaws.com", None,
                                      "http://10.0.0.5:8333"])
def test_default_credentials_off_the_dev_stack_refuse_to_start(endpoint, monkeypatch):
    for var in ("WHETSTONE_S3_ACCESS_KEY", "WHETSTONE_S3_SECRET_KEY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit, match="WHETSTONE_S3_ACCESS_KEY"):
        check_credentials(CommonSettings(s3_endpoint=endpoint))


def test_the_dev_stack_and_real_credentials_start():
    check_credentials(CommonSettings(s3_endpoint="http://127.0.0.1:8333", s3_access_key="whetstone",
                                     s3_secret_key="whetstone-secret"))
    check_credentials(CommonSettings(s3_endpoint="http://[::1]:8333", s3_access_key="whetstone",
                                     s3_secret_key="whetstone-secret"))
    check_credentials(CommonSettings(s3_endpoint="http://minio.storage:9000", s3_access_key="svc-ingest",
                                     s3_secret_key="long-random-secret"))

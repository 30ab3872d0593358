"""S3 out while a job is evaluated: the eval worker backs off and retries without spending its crash attempts,
and evaluates the job once S3 is back (chaos found it giving up after three quick failures). The object store
is reached through a TCP forwarder to the embedded SeaweedFS that the test takes down and brings back."""

from __future__ import annotations

import pytest
from whetstone.devstack.forwarder import Forwarder
from whetstone.devstack.testing import wait_until
from whetstone.eval.bootstrap import build_service
from whetstone.eval.config import EvalSettings
from whetstone.runtime.s3 import ObjectStore

from .test_eval_service import ROWS, _artifacts, _completed, _submit

pytestmark = pytest.mark.integration


async def test_an_s3_outage_is_waited_out_not_counted_as_crashes(platform, settings, tmp_path):
    real = settings.s3_endpoint
    store = ObjectStore(real, settings.s3_access_key, settings.s3_secret_key, "whetstone")
    sha, up, validation = _artifacts(settings, store, tmp_path)
    host, port = real.split("//", 1)[1].rsplit(":", 1)
    s3 = Forwarder(host, int(port))
    await s3.up()
    settings.s3_endpoint = f"http://127.0.0.1:{s3.port}"
    service = lambda: build_service(EvalSettings(lease_s=3, poll_s=0.2, max_attempts=2,
                                                 transient_backoff_s=0.5, transient_backoff_max_s=2))
    async with platform(service) as p:
        rt = p["eval"]
        await s3.down()
        config = {"stages": {"benchmarks": False, "judge": False, "safety": {"enabled": False}}}
        await _submit(settings, "job-out", sha, up.uri, up.manifest_sha256, validation, config)

        async def retried_transiently():
            n = await rt.pool.fetchval("SELECT transient_retries FROM eval_runs WHERE job_id = 'job-out'")
            return (n or 0) >= 3  # more failures than max_attempts allows crashes
        await wait_until(retried_transiently, 120, "three transient retries")
        assert await rt.pool.fetchval("SELECT status FROM eval_runs WHERE job_id = 'job-out'") != "done"
        await s3.up()
        event = (await _completed(rt, "job-out"))[0]["payload"]
        assert not any("crashed" in r for r in event["reasons"]), event["reasons"]
        assert {s["name"] for s in event["stages"]} >= {"holdout"}
        assert next(s for s in event["stages"] if s["name"] == "holdout")["details"]["rows"] == len(ROWS)
        run = await rt.pool.fetchrow("SELECT attempts, last_error FROM eval_runs WHERE job_id = 'job-out'")
        assert run["attempts"] == 1, dict(run)  # the outage's attempts were given back
    await s3.down()

"""The training child's environment is an allow-list of the agent's (issue 35.5): a child launched
the way the agent launches one reads no database DSN, Kafka password, S3 key or internal secret."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from whetstone.trainer_agent.adapters.processes import spawn
from whetstone.trainer_agent.domain.child_env import child_environment
from whetstone.trainer_agent.domain.distributed import DistributedPlan
from whetstone.trainer_agent.domain.launch import build_launch

AGENT_ENV = {
    # what an agent's pod holds: none of it may reach the child
    "WHETSTONE_DATABASE_URL": "postgresql://agent:pw@db/whetstone",
    "WHETSTONE_KAFKA_BOOTSTRAP": "kafka:9092",
    "WHETSTONE_KAFKA_PASSWORD": "kafka-pw",
    "WHETSTONE_KAFKA_SASL_USERNAME": "trainer-agent",
    "WHETSTONE_INTERNAL_SECRET": "internal",
    "WHETSTONE_S3_ACCESS_KEY": "AKIA",
    "WHETSTONE_S3_SECRET_KEY": "s3-secret",
    "WHETSTONE_S3_ENDPOINT": "http://s3:9000",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "AWS_ACCESS_KEY_ID": "AKIA2",
    "HF_TOKEN": "hf_secret",
    "HUGGING_FACE_HUB_TOKEN": "hf_secret2",
    "PGPASSWORD": "pg",
    # what a Python/torch child needs
    "HF_HOME": "/cache/hf",
    "HF_HUB_OFFLINE": "1",
    "NCCL_DEBUG": "WARN",
    "LC_ALL": "C.UTF-8",
    "OMP_NUM_THREADS": "2",
    "WHETSTONE_RECIPE_FAULTS": '{"oom_forwards": 1}',
    "WHETSTONE_GIT_COMMIT": "abc123",
    # a reinforcement child grades: the graders' settings, and the judge key they name
    "WHETSTONE_GRADERS_PYTHON_SANDBOX": "unsafe",
    "WHETSTONE_GRADERS_JUDGES": '{"judge-small": {"base_url": "http://127.0.0.1:9/v1", "api_key_env": "JUDGE_KEY"}}',
    "JUDGE_KEY": "judge-secret",
    "OPENAI_API_KEY": "not-named-by-any-grader",
}


def test_allow_list_keeps_runtime_variables_and_drops_credentials() -> None:
    env = child_environment(AGENT_ENV)
    assert set(env) == {"HF_HOME", "HF_HUB_OFFLINE", "NCCL_DEBUG", "LC_ALL", "OMP_NUM_THREADS",
                        "WHETSTONE_RECIPE_FAULTS", "WHETSTONE_GIT_COMMIT", "WHETSTONE_GRADERS_PYTHON_SANDBOX",
                        "WHETSTONE_GRADERS_JUDGES", "JUDGE_KEY"}
    assert child_environment({"TOKENIZERS_PARALLELISM": "false", "PATH": "/bin"}) == {
        "TOKENIZERS_PARALLELISM": "false", "PATH": "/bin"}


def test_a_launched_child_reads_no_secret(tmp_path: Path) -> None:
    """Launched as the agent launches a segment (build_launch, then spawn with the allow-listed
    environment); the child prints its whole environ."""
    script = "import json, os, sys; sys.stdout.write(json.dumps(dict(os.environ)))"
    launch = build_launch(python=sys.executable, module="json.tool", config_path="unused",
                          plan=DistributedPlan(mode="lora", world_size=1, zero_stage=None, reasons=()),
                          gpu_ids=[], gpu_node=False, key="seg-1",
                          extra_env={"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
    inherited = {**AGENT_ENV, "PATH": "/usr/bin:/bin"}

    async def run() -> dict[str, str]:
        proc = await spawn((sys.executable, "-c", script), launch.environment(child_environment(inherited)),
                           tmp_path / "train.log")
        out, _ = await proc.communicate()
        assert proc.returncode == 0, (tmp_path / "train.log").read_text()
        return json.loads(out)

    seen = asyncio.run(run())
    secrets = {v for k, v in AGENT_ENV.items() if k not in child_environment(AGENT_ENV)}
    leaked = {k for k, v in seen.items() if v in secrets}
    assert not leaked, f"the child read the agent's credentials: {sorted(leaked)}"
    assert not any(k.startswith(("WHETSTONE_DATABASE", "WHETSTONE_KAFKA", "WHETSTONE_S3", "WHETSTONE_INTERNAL",
                                 "AWS_")) for k in seen)
    assert seen["HF_HOME"] == "/cache/hf" and seen["PYTHONUNBUFFERED"] == "1"
    assert seen["WHETSTONE_RECIPE_FAULTS"] == AGENT_ENV["WHETSTONE_RECIPE_FAULTS"]

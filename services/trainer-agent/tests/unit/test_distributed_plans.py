"""The agent's pure planning rules: ZeRO stage / zero_init / DeepSpeed config, the memory model,
launch command lines, rank environment and rendezvous."""

from __future__ import annotations

import json

import pytest
from whetstone.contracts import TOLERANT
from whetstone.contracts import Rendezvous as AssignedRendezvous
from whetstone.trainer_agent.domain.deepspeed_json import DeepSpeedConfig, Offload
from whetstone.trainer_agent.domain.distributed import (
    DistributedConfigError,
    DistributedPlan,
    Topology,
    bytes_per_gpu,
    deepspeed_config,
    param_count_hint,
    plan_distributed,
    requested_zero_stage,
    training_mode,
)
from whetstone.trainer_agent.domain.launch import (
    PORT_BASE,
    PORT_SPAN,
    RANK_VARIABLES,
    Rendezvous,
    build_launch,
    default_master_port,
    gang_nodes,
    resolve_rendezvous,
)

pytestmark = pytest.mark.unit

B = 1e9
H100 = 80.0


def gpus(n: int, nodes: int = 1, memory: float = H100) -> Topology:
    return Topology(nodes=nodes, gpus_per_node=n, gpu_node=True, gpu_memory_gb=memory)


# ------------------------------------------------------------------ memory model


def test_memory_model_matches_the_zero_paper_figures():
    # 7B full fine-tune: 16 bytes/param = 112 GB; ZeRO-3 on 8 GPUs -> 14 GB per GPU
    assert bytes_per_gpu("full", 7 * B, None, 1) == pytest.approx(112 * B)
    assert bytes_per_gpu("full", 7 * B, 3, 8) == pytest.approx(14 * B)
    # ZeRO-1 shards the 12 optimizer bytes only, ZeRO-2 also the 2 gradient bytes
    assert bytes_per_gpu("full", 1 * B, 1, 8) == pytest.approx((4 + 12 / 8) * B)
    assert bytes_per_gpu("full", 1 * B, 2, 8) == pytest.approx((2 + 14 / 8) * B)
    # the 4-bit base costs a quarter of the bf16 one
    assert bytes_per_gpu("qlora", 8 * B, 2, 8) < bytes_per_gpu("lora", 8 * B, 2, 8) / 3


# ------------------------------------------------------------------ ZeRO rules


def test_cpu_node_is_one_plain_process_without_deepspeed():
    plan = plan_distributed("full", 200 * B, Topology(gpu_node=False))
    assert plan.zero_stage is None and not plan.uses_deepspeed and not plan.zero_init
    assert deepspeed_config(plan) is None


def test_cpu_nodes_train_across_nodes_with_plain_ddp():
    plan = plan_distributed("lora", 1e6, Topology(nodes=2, gpu_node=False))
    assert (plan.world_size, plan.zero_stage, plan.uses_deepspeed) == (2, None, False)
    assert "gloo" in plan.reasons[0]


def test_cpu_nodes_launch_torchrun_with_one_worker_each_whatever_the_launcher_setting():
    rdzv = Rendezvous("127.0.0.1", 29999, node_rank=1, nodes=2)
    plan = DistributedPlan(mode="lora", world_size=2, zero_stage=None)
    for launcher in ("torchrun", "deepspeed"):
        spec = launch(plan=plan, gpu_node=False, rendezvous=rdzv, launcher=launcher)
        assert spec.launcher == "torchrun" and "--nproc-per-node=1" in spec.argv and "--node-rank=1" in spec.argv
        assert "CUDA_VISIBLE_DEVICES" not in spec.env
        assert (spec.env["WORLD_SIZE"], spec.env["MASTER_PORT"], spec.env["NODE_RANK"]) == ("2", "29999", "1")


def test_one_gpu_that_fits_is_a_plain_process():
    assert plan_distributed("lora", 7 * B, gpus(1)).zero_stage is None


@pytest.mark.parametrize("mode", ["lora", "qlora"])
def test_adapters_on_several_gpus_use_zero_2(mode):
    plan = plan_distributed(mode, 7 * B, gpus(8))
    assert plan.zero_stage == 2 and not plan.offload_optimizer
    assert "ZeRO-2" in plan.reasons[0]


@pytest.mark.parametrize("stage", [1, 2])
def test_adapters_may_ask_for_zero_1_or_2(stage):
    assert plan_distributed("lora", 7 * B, gpus(4), requested_stage=stage).zero_stage == stage


def test_lora_on_a_base_too_big_to_replicate_uses_zero_3():
    plan = plan_distributed("lora", 70 * B, gpus(8))   # 140 GB of bf16 frozen weights per GPU otherwise
    assert plan.zero_stage == 3 and plan.zero_init


@pytest.mark.parametrize("gpu_count", [1, 8])
def test_qlora_with_zero_3_is_rejected_with_the_reason(gpu_count):
    with pytest.raises(DistributedConfigError, match="QLoRA cannot run with ZeRO-3.*4-bit"):
        plan_distributed("qlora", 7 * B, gpus(gpu_count), requested_stage=3)


def test_qlora_that_would_need_zero_3_is_rejected_not_sharded():
    with pytest.raises(DistributedConfigError, match="QLoRA cannot shard"):
        plan_distributed("qlora", 400 * B, gpus(8))   # 200 GB even at 4 bits


def test_qlora_70b_fits_zero_2_at_four_bits():
    plan = plan_distributed("qlora", 70 * B, gpus(8))
    assert plan.zero_stage == 2 and plan.zero_init


def test_full_fine_tune_that_fits_zero_2_uses_zero_2():
    assert plan_distributed("full", 7 * B, gpus(8)).zero_stage == 2


def test_large_full_fine_tune_uses_zero_3():
    plan = plan_distributed("full", 30 * B, gpus(8))   # ZeRO-2: 112 GB/GPU; ZeRO-3: 60 GB
    assert plan.zero_stage == 3 and not plan.offload_optimizer
    assert "large full fine-tune" in plan.reasons[0]


def test_largest_full_fine_tunes_offload_the_optimizer():
    plan = plan_distributed("full", 70 * B, gpus(8, nodes=2))   # 70 GB/GPU under ZeRO-3 > 64 GB budget
    assert plan.zero_stage == 3 and plan.offload_optimizer
    assert plan_distributed("full", 70 * B, gpus(8, nodes=4)).offload_optimizer is False


def test_full_fine_tune_too_big_for_one_gpu_offloads_to_cpu():
    plan = plan_distributed("full", 7 * B, gpus(1))
    assert plan.zero_stage == 3 and plan.offload_optimizer and plan.offload_params


def test_adapter_too_big_for_one_gpu_is_rejected():
    with pytest.raises(DistributedConfigError, match="more GPUs"):
        plan_distributed("lora", 70 * B, gpus(1))


@pytest.mark.parametrize(("params", "expected"), [(13 * B, False), (13.5 * B, True), (70 * B, True), (None, False)])
def test_zero_init_above_13b_parameters(params, expected):
    assert plan_distributed("lora", params, gpus(8)).zero_init is expected


def test_unknown_gpu_memory_assumes_an_80gb_gpu():
    assert plan_distributed("full", 30 * B, gpus(8, memory=0)).zero_stage == 3
    assert plan_distributed("full", 7 * B, gpus(8, memory=0)).zero_stage == 2


def test_zero_stage_0_is_refused_when_the_replicas_do_not_fit():
    with pytest.raises(DistributedConfigError, match="zero_stage 0"):
        plan_distributed("full", 7 * B, gpus(8), requested_stage=0)
    assert plan_distributed("lora", 1 * B, gpus(8), requested_stage=0).zero_stage == 0


def test_zero_1_or_2_on_one_gpu_shards_nothing():
    assert plan_distributed("lora", 1 * B, gpus(1), requested_stage=2).zero_stage is None


@pytest.mark.parametrize(("method", "hyper", "mode"), [
    ("lora", {}, "lora"), ("qlora", {}, "qlora"), ("full", {}, "full"), ("dpo", {}, "lora"),
    ("orpo", {"adapter": "qlora"}, "qlora"), ("cpt", {"adapter": "none"}, "full"),
])
def test_training_mode_per_method(method, hyper, mode):
    assert training_mode(method, hyper) == mode


def test_training_mode_rejects_unknowns():
    with pytest.raises(DistributedConfigError, match="adapter"):
        training_mode("dpo", {"adapter": "dora"})
    with pytest.raises(DistributedConfigError, match="method"):
        training_mode("rlhf", {})


@pytest.mark.parametrize("bad", [4, -1, "3", True, 2.0])
def test_requested_zero_stage_is_validated(bad):
    with pytest.raises(DistributedConfigError, match="zero_stage"):
        requested_zero_stage({"zero_stage": bad})
    assert requested_zero_stage({}) is None and requested_zero_stage({"zero_stage": 3}) == 3


def test_deepspeed_config_zero_2_leaves_batch_and_precision_to_the_trainer():
    config = deepspeed_config(plan_distributed("lora", 7 * B, gpus(8)))
    assert config is not None and config.zero_stage == 2
    document = config.document()
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                "gradient_clipping"):
        assert document[key] == "auto"
    assert document["bf16"] == {"enabled": "auto"}
    assert "offload_optimizer" not in document["zero_optimization"] and "optimizer" not in document
    assert not any(k.startswith("stage3") for k in document["zero_optimization"])


def test_deepspeed_config_zero_3_gathers_weights_on_save_and_offloads_when_planned():
    zero3 = deepspeed_config(plan_distributed("full", 30 * B, gpus(8)))
    assert zero3 and zero3.zero_optimization and zero3.zero_optimization.stage3_gather_16bit_weights_on_model_save
    offloaded = deepspeed_config(plan_distributed("full", 7 * B, gpus(1)))
    assert offloaded and offloaded.zero_optimization and offloaded.optimizer
    assert offloaded.zero_optimization.offload_optimizer == Offload(device="cpu", pin_memory=True)
    assert offloaded.zero_optimization.offload_param == Offload(device="cpu", pin_memory=True)
    assert offloaded.optimizer.type == "AdamW"


def test_a_deepspeed_document_reads_typed_and_writes_back_key_for_key():
    """The agent's file as the child reads it comes back byte for byte; a config given inline with keys the
    platform does not type (DeepSpeed's own) comes back with every key and nothing added (typed keys first)."""
    written = deepspeed_config(plan_distributed("full", 7 * B, gpus(1)))
    assert written is not None
    text = written.model_dump_json(indent=1)
    assert DeepSpeedConfig.model_validate_json(text, context=TOLERANT).model_dump_json(indent=1) == text
    inline = {"zero_optimization": {"stage": 3, "sub_group_size": 1000000000, "offload_param": {"device": "cpu"}},
              "activation_checkpointing": {"partition_activations": True}, "train_batch_size": 64}
    read = DeepSpeedConfig.model_validate(inline, context=TOLERANT)
    assert read.zero_stage == 3 and read.train_batch_size == 64
    assert read.document() == inline and "pin_memory" not in json.dumps(read.document())
    with pytest.raises(ValueError, match="zero_optimization.stage"):
        DeepSpeedConfig.model_validate({"zero_optimization": {"stage": "three"}}, context=TOLERANT)
    with pytest.raises(ValueError, match="activation_checkpointing"):   # the agent writes only typed keys
        DeepSpeedConfig.model_validate(inline)


@pytest.mark.parametrize(("name", "params"), [
    ("meta-llama/Llama-3.1-70B-Instruct", 70e9), ("Qwen/Qwen2.5-0.5B", 0.5e9), ("mistralai/Mixtral-8x7B-v0.1", 56e9),
    ("HuggingFaceTB/SmolLM2-135M", 135e6), ("tiny-llama", None),
])
def test_param_count_hint_from_hub_names(name, params):
    assert param_count_hint(name) == params


def hf_filled(config: dict) -> dict:
    """What the HF Trainer does to the "auto" values (one process, micro-batch 1, bf16)."""
    concrete = {"bf16": {"enabled": True}, "fp16": {"enabled": False}, "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1, "train_batch_size": 1, "gradient_clipping": 1.0}
    zero = {k: (int(5e8) if v == "auto" else v) for k, v in config["zero_optimization"].items()}
    filled = {**config, **concrete, "zero_optimization": zero}
    if "optimizer" in config:
        filled["optimizer"] = {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.999], "eps": 1e-8,
                                                           "weight_decay": 0.0}}
    return filled


def test_deepspeed_configs_validate_against_deepspeed_when_installed():
    ds_config = pytest.importorskip("deepspeed.runtime.config")
    plans = [plan_distributed("lora", 7 * B, gpus(8)), plan_distributed("lora", 7 * B, gpus(8), requested_stage=1),
             plan_distributed("full", 30 * B, gpus(8)), plan_distributed("full", 7 * B, gpus(1)),
             plan_distributed("full", 70 * B, gpus(8, nodes=2))]
    for plan in plans:
        written = deepspeed_config(plan)
        assert written is not None
        parsed = ds_config.DeepSpeedConfig(hf_filled(written.document()))   # unknown keys or bad values raise
        assert parsed.zero_optimization_stage == plan.zero_stage
        assert (parsed.zero_config.offload_optimizer is not None) == plan.offload_optimizer


# ------------------------------------------------------------------ launch


PLAIN = DistributedPlan(mode="lora", world_size=1, zero_stage=None)
ZERO2 = DistributedPlan(mode="lora", world_size=2, zero_stage=2)


def launch(**kw):
    args = dict(python="/venv/python", module="whetstone.trainer_agent.recipes.main", config_path="/s/config.json",
                plan=PLAIN, gpu_ids=[0], gpu_node=True, key="job-1-s1", hostfile_path="/s/hostfile")
    return build_launch(**{**args, **kw})


def test_cpu_node_launches_one_plain_process_without_rank_or_gpu_variables():
    spec = launch(gpu_node=False)
    assert spec.launcher == "process"
    assert spec.argv == ("/venv/python", "-m", "whetstone.trainer_agent.recipes.main", "--config", "/s/config.json")
    env = spec.environment({"PATH": "/bin", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "MASTER_ADDR": "x"})
    assert env == {"PATH": "/bin"}
    assert set(RANK_VARIABLES) <= set(spec.unset)


def test_single_gpu_is_a_plain_process_that_sees_only_its_gpu():
    spec = launch(gpu_ids=[3])
    assert spec.launcher == "process" and spec.env["CUDA_VISIBLE_DEVICES"] == "3"


def test_multi_gpu_torchrun_command_line_and_rank_environment():
    spec = launch(plan=ZERO2, gpu_ids=[2, 3], shutdown_timeout_s=90)
    port = default_master_port("job-1-s1")
    assert spec.launcher == "torchrun"
    assert spec.argv == (
        "/venv/python", "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--node-rank=0",
        "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0", "--shutdown-timeout=90",
        "-m", "whetstone.trainer_agent.recipes.main", "--config", "/s/config.json")
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert {k: spec.env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK")} == {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "NODE_RANK": "0"}
    # per-worker RANK / LOCAL_RANK come from torchrun: none may leak in from the agent's own environment
    env = spec.environment({"RANK": "7", "LOCAL_RANK": "7", "WORLD_SIZE": "99"})
    assert "RANK" not in env and "LOCAL_RANK" not in env and env["WORLD_SIZE"] == "2"


def test_multi_node_torchrun_uses_the_assignment_rendezvous():
    rdzv = Rendezvous("10.0.0.5", 29611, node_rank=1, nodes=2)
    spec = launch(plan=ZERO2, gpu_ids=[4, 5, 6, 7], rendezvous=rdzv)
    assert "--nnodes=2" in spec.argv and "--node-rank=1" in spec.argv and "--nproc-per-node=4" in spec.argv
    assert "--master-addr=10.0.0.5" in spec.argv and "--master-port=29611" in spec.argv
    assert spec.env["WORLD_SIZE"] == "8" and spec.env["NODE_RANK"] == "1" and spec.env["MASTER_ADDR"] == "10.0.0.5"
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_deepspeed_on_one_gpu_still_gets_a_launcher():
    plan = DistributedPlan(mode="full", world_size=1, zero_stage=3, offload_optimizer=True, offload_params=True)
    spec = launch(plan=plan, gpu_ids=[1])
    assert spec.launcher == "torchrun" and "--nproc-per-node=1" in spec.argv and spec.env["WORLD_SIZE"] == "1"


def test_zero_init_with_zero_3_is_exported_to_the_trainer():
    plan = DistributedPlan(mode="full", world_size=8, zero_stage=3, zero_init=True)
    assert launch(plan=plan, gpu_ids=list(range(8))).env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true"
    assert "ACCELERATE_DEEPSPEED_ZERO3_INIT" not in launch(plan=ZERO2, gpu_ids=[0, 1]).env


def test_deepspeed_runner_single_node_selects_gpus_with_include():
    spec = launch(plan=ZERO2, gpu_ids=[2, 3], launcher="deepspeed")
    assert spec.launcher == "deepspeed" and spec.hostfile is None
    assert spec.argv[:3] == ("/venv/python", "-m", "deepspeed.launcher.runner")
    assert "--include=localhost:2,3" in spec.argv and "--module" in spec.argv and "--no_local_rank" in spec.argv
    assert spec.argv[-3:] == ("whetstone.trainer_agent.recipes.main", "--config", "/s/config.json")
    assert "CUDA_VISIBLE_DEVICES" in spec.unset and "CUDA_VISIBLE_DEVICES" not in spec.env


def test_deepspeed_runner_multi_node_runs_without_ssh_from_a_hostfile():
    rdzv = Rendezvous("10.0.0.5", 29611, node_rank=1, nodes=2, hosts=("gpu-a", "gpu-b"))
    spec = launch(plan=ZERO2, gpu_ids=[2, 3], launcher="deepspeed", rendezvous=rdzv)
    assert spec.hostfile == "gpu-a slots=2\ngpu-b slots=2\n"
    assert "--no_ssh" in spec.argv and "--node_rank=1" in spec.argv and "--hostfile=/s/hostfile" in spec.argv
    assert "--include=gpu-a:0,1@gpu-b:2,3" in spec.argv
    assert "--master_addr=10.0.0.5" in spec.argv and "--master_port=29611" in spec.argv
    assert spec.env["WORLD_SIZE"] == "4" and spec.env["NODE_RANK"] == "1"


def test_deepspeed_runner_multi_node_needs_every_host():
    with pytest.raises(DistributedConfigError, match="every node's host"):
        launch(plan=ZERO2, gpu_ids=[0], launcher="deepspeed", rendezvous=Rendezvous("10.0.0.5", 29611, 0, 2))


def test_unknown_launcher_is_rejected():
    with pytest.raises(DistributedConfigError, match="launcher"):
        launch(plan=ZERO2, gpu_ids=[0, 1], launcher="mpirun")


def test_master_port_is_derived_alike_on_every_node():
    assert default_master_port("job-9-s2") == default_master_port("job-9-s2")
    assert PORT_BASE <= default_master_port("anything") < PORT_BASE + PORT_SPAN


def test_the_assigned_rendezvous_resolves_to_where_the_ranks_meet():
    assert resolve_rendezvous(None, "k") is None and gang_nodes(None) == 1
    assigned = AssignedRendezvous(master_addr="10.0.0.1", nodes=2, node_rank=1)
    assert resolve_rendezvous(assigned, "seg") == Rendezvous("10.0.0.1", default_master_port("seg"), 1, 2)
    named = AssignedRendezvous(master_addr="a", nodes=2, node_rank=0, hosts=["a", "b"], master_port=29999)
    assert resolve_rendezvous(named, "seg") == Rendezvous("a", 29999, 0, 2, ("a", "b"))
    assert gang_nodes(named) == 2

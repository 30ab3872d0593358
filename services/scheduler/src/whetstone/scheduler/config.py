from datetime import timedelta

from pydantic import BaseModel, Field
from pydantic_settings import SettingsConfigDict
from whetstone.runtime.settings import ServiceSettings

from .domain.admission import DEFAULT_QUOTAS, Quota
from .domain.eval_bounds import EvalBounds
from .domain.policy import DEFAULT_TIERS, Policy
from .domain.timeouts import Timeouts


class QuotaSettings(BaseModel):
    soft_gpu_hours: float | None = None
    hard_gpu_hours: float | None = None
    max_in_flight: int | None = None


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_SCHEDULER_", extra="ignore")
    http_port: int = 8100
    # the operator's MLflow tracking server (the registry logs to it): set, a job may ask for `mlflow` tracking
    mlflow_tracking_uri: str | None = Field(None, validation_alias="WHETSTONE_MLFLOW_TRACKING_URI")
    node_timeout_s: float = 20.0
    lost_node_check_s: float = 5.0
    max_node_lost_requeues: int = Field(5, ge=0, description="re-queues of one job after a lost node (its "
                                        "heartbeat timed out, or a gang peer's collective broke); the next loss "
                                        "fails the job (platform, code nodes_lost) naming the nodes lost")
    # platform-side timeouts per non-terminal state (validating: dataset_wait_s); each ends in a
    # named failure (error_class platform) or a re-queue with job.preempted reason platform_timeout
    provisioning_timeout_s: float = Field(900.0, description="assigned, but no job.started within this")
    running_timeout_s: float = Field(1800.0, description="on a node with no progress, start or checkpoint for this")
    checkpointing_timeout_s: float = Field(1800.0, description="checkpoint-and-stop requested, no job.preempted")
    evaluating_timeout_s: float = Field(7200.0, description="training succeeded, no eval.completed within this")
    timeout_check_s: float = Field(5.0, description="how often the timeout watcher looks")
    dataset_wait_s: float = 600.0
    eval_bounds: EvalBounds = Field(default_factory=EvalBounds,
                                    description="what a tenant's eval_config may ask of the eval gate (JSON)")
    unknown_dataset_grace_s: float = Field(30.0, description="a training_file never submitted fails after this")
    cycle_interval_s: float = Field(5.0, description="a scheduling cycle runs at least this often (aging, targets)")
    unplaceable_grace_s: float = Field(1800.0, description="a queued job no known node can ever hold fails after this")
    cycle_in_request: bool = Field(False, description="baseline for bench/scheduler.py only: each create also "
                                   "runs a scheduling cycle before it answers (the pre-loop behaviour)")
    fetch_max_wait_ms: int = Field(20, description="longest idle wait of the Kafka consumer's fetch")
    queue_scan: int = Field(2000, description="queued jobs one cycle looks at, in priority order")
    forecast_limit: int = Field(200, description="queued jobs that get an estimated start time")
    # resources
    cpu_memory_gb: float = Field(16.0, description="memory a CPU node (gpu_type 'cpu') offers a job")
    cpu_max_params: int = Field(200_000_000, description="largest model trained on a CPU node")
    default_runtime_s: float = Field(3600.0, description="runtime estimate when the token count is unknown")
    # preemption and spot
    checkpoint_s: float = Field(120.0, description="time a victim gets to checkpoint and stop")
    spot_fallback_after: int = Field(2, description="K: spot preemptions before a job prefers on-demand")
    overdue_guard: bool = Field(True, description="a job that has waited overdue_after_s in all, and "
                                "overdue_drain_factor x the cluster's drain time, is served first and the nodes "
                                "it will start on are spared by preemption when other victims will do")
    overdue_after_s: float = Field(4 * 3600.0, ge=0, description="the guard's fixed threshold")
    overdue_drain_factor: float = Field(0.3, ge=0, description="the guard's threshold as a fraction of the time "
                                        "the cluster needs for all the work it holds")
    # quotas: per tier, then per tenant overrides
    tier_quotas: dict[str, QuotaSettings] = Field(default_factory=lambda: {
        t: QuotaSettings(**vars(q)) for t, q in DEFAULT_QUOTAS.items()})
    tenant_quotas: dict[str, QuotaSettings] = Field(default_factory=dict)
    # kubernetes inventory
    k8s_inventory: bool = Field(False, description="build the node inventory from the Kubernetes API")
    k8s_host: str | None = Field(None, description="API server URL; unset = in-cluster config, then kubeconfig")
    k8s_label_selector: str = "nvidia.com/gpu.present=true"
    # base models a tenant may name besides the catalog's: Hub ids, `org/name` (resolved to a commit
    # once, then pinned) or `org/name@<40-hex commit>` (pinned here; no Hub call, works offline)
    hub_models: list[str] = Field(default_factory=list, description="Hub ids tenants may fine-tune (JSON list)")
    # tenant webhooks: 5 tries over about 3 minutes by default (backoff base, 4x, 16x, 64x)
    webhook_max_attempts: int = Field(5, ge=1, description="tries of one delivery before it is marked failed")
    webhook_backoff_s: float = Field(2.0, gt=0, description="wait after the first failure; x4 after each next")
    webhook_timeout_s: float = Field(5.0, gt=0, description="a delivery's whole deadline: resolving, connecting, "
                                     "sending and the receiver's status line")
    webhook_poll_s: float = Field(1.0, gt=0, description="how often the sender looks for due deliveries")
    webhook_batch: int = Field(20, ge=1, description="deliveries one sender round claims")
    webhook_max_per_tenant: int = Field(20, ge=0, description="live webhooks one tenant may have")
    webhook_allow_hosts: list[str] = Field(default_factory=list, description="host names, addresses or networks "
                                           "(CIDR), each optionally with :port, a webhook may reach although they "
                                           "are not public, e.g. a test receiver on loopback: "
                                           "'[\"127.0.0.1:8123\"]' (JSON list). Empty: public addresses only")

    @property
    def node_timeout(self) -> timedelta:
        return timedelta(seconds=self.node_timeout_s)

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(self.provisioning_timeout_s, self.running_timeout_s, self.checkpointing_timeout_s,
                        self.evaluating_timeout_s)

    def quota_for(self, tenant_id: str, tier: str) -> Quota:
        base = self.tier_quotas.get(tier) or QuotaSettings()
        override = self.tenant_quotas.get(tenant_id)
        merged = base.model_dump()
        if override is not None:
            merged.update(override.model_dump(exclude_unset=True))
        return Quota(**merged)

    def policy(self) -> Policy:
        return Policy(tiers=dict(DEFAULT_TIERS), checkpoint_s=self.checkpoint_s,
                      spot_fallback_after=self.spot_fallback_after,
                      overdue_after_s=self.overdue_after_s if self.overdue_guard else None,
                      overdue_drain_factor=self.overdue_drain_factor)

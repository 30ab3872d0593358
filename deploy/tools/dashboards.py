"""Generates the Grafana dashboards under deploy/grafana/ (except metering-dashboard.json, kept by hand).

    .venv/bin/python deploy/tools/dashboards.py          # write
    .venv/bin/python deploy/tools/dashboards.py --check  # exit 1 when a file is out of date

Every panel's PromQL is evaluated against a real Prometheus scraping a real workload by
tests/ops/test_dashboards_prometheus.py; a panel whose subject that workload does not exercise
says so in `idle` (the reason), and then only has to query without error over exported metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generated import write_or_check  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "grafana"
DS = {"type": "prometheus", "uid": "${datasource}"}
R = "$__rate_interval"


def panel(title: str, *exprs: str | tuple[str, str], unit: str = "short", kind: str = "timeseries",
          desc: str = "", idle: str = "") -> dict:
    targets = []
    for i, e in enumerate(exprs):
        expr, legend = e if isinstance(e, tuple) else (e, "")
        targets.append({"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend})
    p = {"type": kind, "title": title, "datasource": DS, "targets": targets,
         "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}}
    if desc:
        p["description"] = desc
    if idle:  # read by the test only: why the demo workload leaves this panel empty
        p["whetstoneIdleInDemo"] = idle
    return p


def dashboard(uid: str, title: str, desc: str, panels: list[dict], variables: list[dict] = ()) -> dict:
    x = y = 0
    for i, p in enumerate(panels):
        w = 6 if p["type"] == "stat" else 12
        if x + w > 24:
            x, y = 0, y + 8
        p["id"] = i + 1
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": 8}
        x += w
    return {"title": title, "uid": uid, "description": desc, "tags": ["whetstone"], "schemaVersion": 39,
            "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
            "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                     "label": "Data source"}, *variables]},
            "panels": panels}


SERVICE_VAR = {"name": "service", "type": "query", "datasource": DS,
               "query": "label_values(whetstone_service_up, service)", "multi": True, "includeAll": True,
               "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "refresh": 2}
S = '{service=~"$service"}'


def bus() -> dict:
    return dashboard("whetstone-bus", "Whetstone — bus (topics, lag, dead letters, outbox)",
                     "Kafka topics as the services see them: produce and consume rates, consumer lag per group "
                     "(committed offsets vs end offsets, from the broker), handler latency, inbox duplicates, "
                     "DLQ depth (not yet acknowledged by group whetstone-dlq-review), outbox backlog.", [
        panel("Produced / s by topic (outbox relay)",
              (f"sum by (topic) (rate(whetstone_messages_produced_total{S}[{R}]))", "{{topic}}"), unit="ops"),
        panel("Appended / s by topic (broker end offsets, every producer)",
              (f"max by (topic) (rate(whetstone_topic_high_watermark[{R}]))", "{{topic}}"), unit="ops"),
        panel("Consumed / s by topic and outcome",
              (f"sum by (topic, outcome) (rate(whetstone_messages_consumed_total{S}[{R}]))",
               "{{topic}} {{outcome}}"), unit="ops"),
        panel("Consumer lag by group and topic",
              (f"sum by (group, topic) (whetstone_consumer_lag{S})", "{{group}} {{topic}}")),
        panel("Highest partition lag",
              (f"topk(10, max by (group, topic, partition) (whetstone_consumer_lag{S}))",
               "{{group}} {{topic}}/{{partition}}"), kind="table"),
        panel("Handler latency p99 by topic",
              (f"histogram_quantile(0.99, sum by (le, service, topic) "
               f"(rate(whetstone_handler_seconds_bucket{S}[{R}])))", "{{service}} {{topic}}"), unit="s"),
        panel("Inbox duplicates absorbed / s",
              (f'sum by (service, topic) (rate(whetstone_messages_consumed_total{{outcome="duplicate", '
               f'service=~"$service"}}[{R}]))', "{{service}} {{topic}}"), unit="ops"),
        panel("DLQ depth by topic", ("max by (topic) (whetstone_dlq_depth)", "{{topic}}"),
              desc="Alert WhetstoneDLQNotEmpty; runbook in README (Operations)."),
        panel("Dead-lettered (last hour) by service and topic",
              (f"sum by (service, topic) (increase(whetstone_dead_lettered_total{S}[1h]))",
               "{{service}} {{topic}}")),
        panel("Outbox backlog (rows not published)",
              (f"max by (service) (whetstone_outbox_backlog{S})", "{{service}}")),
        panel("Oldest unpublished outbox row",
              (f"max by (service) (whetstone_outbox_oldest_age_seconds{S})", "{{service}}"), unit="s"),
        panel("Outbox rows quarantined (refused by the broker)",
              (f"max by (service) (whetstone_outbox_quarantined{S})", "{{service}}"),
              desc="Alert WhetstoneOutboxQuarantined."),
        panel("Relay publish latency p99 (send to broker ack)",
              (f"histogram_quantile(0.99, sum by (le, service) "
               f"(rate(whetstone_outbox_publish_seconds_bucket{S}[{R}])))", "{{service}}"), unit="s"),
        panel("Services up", ('sum by (job) (up{job=~"whetstone-.*"})', "{{job}}"), kind="stat"),
        panel("Metrics collection errors (last hour)",
              (f"sum by (service, source) (increase(whetstone_observability_errors_total{S}[1h]))",
               "{{service}} {{source}}"),
              idle="only when the broker refuses the admin API, a probe fails or metric names collide"),
    ], [SERVICE_VAR])


def scheduler() -> dict:
    return dashboard("whetstone-scheduler", "Whetstone — scheduler and GPU pool",
                     "Queues per tier, admission, placement, preemption, jobs per state and the node inventory "
                     "(from heartbeats, as the scheduler recorded them); queue waits at placement, and GPU/CPU "
                     "figures per node from the trainer agents' heartbeats.", [
        panel("Queue depth by tier", ("max by (tier) (whetstone_scheduler_queue_depth)", "{{tier}}")),
        panel("Longest queue wait by tier", ("max by (tier) (whetstone_scheduler_oldest_wait_seconds)", "{{tier}}"),
              unit="s"),
        panel("Jobs admitted / s by tier",
              (f"sum by (tier) (rate(whetstone_jobs_queued_total[{R}]))", "{{tier}}"), unit="ops"),
        panel("Admission rejections (last hour) by reason",
              ("sum by (code) (increase(whetstone_scheduler_admission_rejected_total[1h]))", "{{code}}")),
        panel("Jobs by state (not finished)", ("max by (state) (whetstone_jobs)", "{{state}}")),
        panel("Longest time in current state",
              ("max by (state) (whetstone_job_state_age_seconds)", "{{state}}"), unit="s",
              desc="Alert WhetstoneJobStuck fires past each state's timeout."),
        panel("Placements / s by kind",
              (f"sum by (how) (rate(whetstone_scheduler_assigned_total[{R}]))", "{{how}}"), unit="ops"),
        panel("Scheduling cycle p99",
              (f"histogram_quantile(0.99, sum by (le) (rate(whetstone_scheduler_cycle_seconds_bucket[{R}])))",
               "p99"), unit="s"),
        panel("Preemption requests (last hour) by reason",
              ("sum by (reason) (increase(whetstone_scheduler_preemption_requests_total[1h]))", "{{reason}}"),
              idle="the demo has one job and a free node: nothing to preempt"),
        panel("Preemptions (last hour) by cause",
              ("sum by (reason) (increase(whetstone_jobs_preempted_total[1h]))", "{{reason}}"),
              idle="the demo has one job and a free node: nothing to preempt"),
        panel("Live nodes by GPU type", ('sum by (gpu_type, spot) (max by (gpu_type, spot) (whetstone_nodes{lost="false"}))',
                                         "{{gpu_type}} spot={{spot}}")),
        panel("GPUs on live nodes", ("max by (gpu_type) (whetstone_node_gpus)", "{{gpu_type}}")),
        panel("Stalest heartbeat by GPU type", ("max by (gpu_type) (whetstone_node_heartbeat_age_seconds)",
                                               "{{gpu_type}}"), unit="s",
              desc="Alert WhetstoneHeartbeatsMissing."),
        panel("Queue wait at placement p50 / p90 by tier",
              (f"histogram_quantile(0.5, sum by (le, tier) (rate(whetstone_scheduler_queue_wait_seconds_bucket[{R}])))",
               "p50 {{tier}}"),
              (f"histogram_quantile(0.9, sum by (le, tier) (rate(whetstone_scheduler_queue_wait_seconds_bucket[{R}])))",
               "p90 {{tier}}"), unit="s", desc="Observed as each job leaves the queue for a placement."),
        panel("GPU utilisation by node (heartbeats, nvidia-smi)",
              ("max by (node, gpu_type) (whetstone_node_gpu_utilization_ratio)", "{{node}} ({{gpu_type}})"),
              unit="percentunit", idle=NO_GPU),
        panel("GPU memory used / total by node",
              ("max by (node) (whetstone_node_gpu_memory_used_bytes)", "used {{node}}"),
              ("max by (node) (whetstone_node_gpu_memory_total_bytes)", "total {{node}}"), unit="bytes", idle=NO_GPU),
        panel("GPU power and hottest GPU by node",
              ("max by (node) (whetstone_node_gpu_power_watts)", "W {{node}}"),
              ("max by (node) (whetstone_node_gpu_temperature_celsius)", "°C {{node}}"), idle=NO_GPU),
        panel("Node CPU busy (heartbeats)", ("max by (node) (whetstone_node_cpu_utilization_ratio)", "{{node}}"),
              unit="percentunit"),
        panel("Trainer agent + training processes resident memory by node",
              ("max by (node) (whetstone_node_agent_rss_bytes)", "{{node}}"), unit="bytes"),
    ])


NO_GPU = "the demo's node is a CPU: no nvidia-smi, so no GPU figures in its heartbeats"


def training() -> dict:
    return dashboard("whetstone-training", "Whetstone — training",
                     "Throughput and outcomes from the trainer agents' committed events (job.progress, "
                     "job.completed, job.failed, job.preempted). Per-step metrics of one job: "
                     "GET /v1/fine_tuning/jobs/{id}/events and checkpoints (not Prometheus series).", [
        panel("Training steps / s", (f"sum(rate(whetstone_training_steps_total[{R}]))", "steps/s"), unit="ops"),
        panel("Tokens trained / s (progress deltas)",
              (f"sum(rate(whetstone_training_tokens_total[{R}]))", "tokens/s"),
              idle="only when the recipe reports tokens_seen"),
        panel("Reported throughput p50 / p90 (tokens/s)",
              (f"histogram_quantile(0.5, sum by (le) (rate(whetstone_training_tokens_per_second_bucket[{R}])))", "p50"),
              (f"histogram_quantile(0.9, sum by (le) (rate(whetstone_training_tokens_per_second_bucket[{R}])))", "p90")),
        panel("Step time p50 / p99",
              (f"histogram_quantile(0.5, sum by (le) (rate(whetstone_training_step_seconds_bucket[{R}])))", "p50"),
              (f"histogram_quantile(0.99, sum by (le) (rate(whetstone_training_step_seconds_bucket[{R}])))", "p99"),
              unit="s"),
        panel("GPU (or CPU) utilisation reported", ("max(whetstone_training_gpu_utilization_ratio)", "utilisation"),
              unit="percentunit", idle="CPU nodes report no utilisation in job.progress"),
        panel("Jobs running", ('sum(max by (state) (whetstone_jobs{state=~"running|checkpointing|provisioning"}))',
                               "running")),
        panel("Training runs finished (last hour)", ("sum(increase(whetstone_training_completed_total[1h]))",
                                                     "completed"), kind="stat"),
        panel("Jobs failed (last hour) by class",
              ("sum by (error_class) (increase(whetstone_jobs_failed_total[1h]))", "{{error_class}}"),
              idle="the demo job succeeds"),
        panel("Training handler latency p99 (agent)",
              (f'histogram_quantile(0.99, sum by (le, topic) (rate(whetstone_handler_seconds_bucket'
               f'{{service="trainer-agent"}}[{R}])))', "{{topic}}"), unit="s"),
        panel("MFU p50 / p90 (6 x params x tokens/s over the GPUs' bf16 peak)",
              (f"histogram_quantile(0.5, sum by (le) (rate(whetstone_training_mfu_ratio_bucket[{R}])))", "p50"),
              (f"histogram_quantile(0.9, sum by (le) (rate(whetstone_training_mfu_ratio_bucket[{R}])))", "p90"),
              unit="percentunit", idle="MFU needs a GPU of a known type; the demo trains on CPU"),
    ])


def eval_registry() -> dict:
    return dashboard("whetstone-eval-registry", "Whetstone — eval gate and registry",
                     "Eval verdicts and stage results (from eval.completed as the eval service committed them), "
                     "model registrations and stage changes, dataset validation outcomes.", [
        panel("Eval verdicts (last hour)", ("sum by (verdict) (increase(whetstone_eval_verdicts_total[1h]))",
                                            "{{verdict}}")),
        panel("Eval gate failure rate (last hour)",
              ('(sum(increase(whetstone_eval_verdicts_total{verdict="failed"}[1h])) or vector(0)) '
               "/ sum(increase(whetstone_eval_verdicts_total[1h]))", "failed / all"), unit="percentunit",
              desc="Alert WhetstoneEvalGateFailureRate."),
        panel("Eval stage results (last hour)",
              ("sum by (stage, status) (increase(whetstone_eval_stage_results_total[1h]))", "{{stage}} {{status}}")),
        panel("Eval handling time p90",
              (f'histogram_quantile(0.9, sum by (le, topic) (rate(whetstone_handler_seconds_bucket'
               f'{{service="eval"}}[{R}])))', "{{topic}}"), unit="s"),
        panel("Models registered (last hour) by stage",
              ("sum by (stage) (increase(whetstone_models_registered_total[1h]))", "{{stage}}")),
        panel("Stage changes (last hour) by target stage",
              ("sum by (to_stage) (increase(whetstone_model_promotions_total[1h]))", "{{to_stage}}")),
        panel("Datasets validated (last hour) by status",
              ("sum by (status) (increase(whetstone_datasets_validated_total[1h]))", "{{status}}")),
    ])


def metering_tiers() -> dict:
    m = "whetstone_usage_gpu_seconds_total"
    return dashboard("whetstone-metering-tiers", "Whetstone — GPU-seconds by tier",
                     "GPU-seconds and cost metered per tier and charge class, counted from usage.metered "
                     "segment lines as metering committed them (tenant ledger detail: the metering dashboard).", [
        panel("GPU-seconds billed / h by tier",
              (f'sum by (tier) (rate({m}{{charge_class="charged"}}[1h])) * 3600', "{{tier}}")),
        panel("GPU-seconds metered (last day) by tier and charge class",
              (f"sum by (tier, charge_class) (increase({m}[1d]))", "{{tier}} {{charge_class}}")),
        panel("GPU-seconds refunded (last day) by tier",
              (f'sum by (tier) (increase({m}{{charge_class="refunded"}}[1d]))', "{{tier}}"),
              idle="the demo job is charged, nothing is refunded",
              desc="Alert WhetstoneRefundsSpike."),
        panel("Refunded share of GPU-seconds (last hour)",
              (f'(sum(increase({m}{{charge_class="refunded"}}[1h])) or vector(0)) / sum(increase({m}[1h]))',
               "refunded"),
              unit="percentunit"),
        panel("Cost metered (last day) by tier",
              ("sum by (tier, currency) (increase(whetstone_usage_cost_total{charge_class=\"charged\"}[1d]))",
               "{{tier}} {{currency}}")),
        panel("GPU-seconds by GPU type (last day)", (f"sum by (gpu_type) (increase({m}[1d]))", "{{gpu_type}}")),
    ])


DASHBOARDS = {"bus.json": bus, "scheduler.json": scheduler, "training.json": training,
              "eval-registry.json": eval_registry, "metering-tiers.json": metering_tiers}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=1, ensure_ascii=False) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: list[str]) -> int:
    return write_or_check(render(), OUT, "dashboards.py", argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Gauges the runtime's collector reads from the scheduler's own tables (jobs by state, nodes, GPUs,
heartbeat age): declared here, by the service that owns the schema, and handed to the runtime through
`Service(probes=...)`."""

from whetstone.runtime.observability import Probe

_ACTIVE = "status NOT IN ('succeeded', 'failed', 'cancelled')"
PROBES: tuple[Probe, ...] = (
    Probe("whetstone_jobs", "Jobs not finished, by state", ("state",),
          f"SELECT status, count(*)::float8 FROM jobs WHERE {_ACTIVE} GROUP BY status"),
    Probe("whetstone_job_state_age_seconds", "Oldest time a job has spent in its current state",
          ("state",),
          "SELECT status, extract(epoch FROM now() - min(coalesce(state_since, updated_at)))::float8 FROM jobs "
          f"WHERE {_ACTIVE} GROUP BY status"),
    Probe("whetstone_nodes", "Nodes that sent a heartbeat in the last hour", ("gpu_type", "spot", "lost"),
          "SELECT gpu_type, spot::text, lost::text, count(*)::float8 FROM nodes "
          "WHERE last_seen > now() - interval '1 hour' GROUP BY 1, 2, 3"),
    Probe("whetstone_node_gpus", "GPUs on live nodes", ("gpu_type",),
          "SELECT gpu_type, sum(gpu_count)::float8 FROM nodes "
          "WHERE NOT lost AND last_seen > now() - interval '1 hour' GROUP BY 1"),
    Probe("whetstone_node_heartbeat_age_seconds",
          "Seconds since the stalest node (seen in the last hour) sent a heartbeat", ("gpu_type",),
          "SELECT gpu_type, extract(epoch FROM now() - min(last_seen))::float8 FROM nodes "
          "WHERE last_seen > now() - interval '1 hour' GROUP BY 1"),
)

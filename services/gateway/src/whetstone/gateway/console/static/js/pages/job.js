// One job, live: status and ETA, the loss chart, events, checkpoints and the eval verdict, all kept
// current by the job's server-sent event stream (no polling): each event adds its point or line, and a
// state change reloads the job object once.
import { api, jobEvents } from "../api.js";
import { h, append, clear, when, num, table, statusBadge, notice, jsonBlock } from "../dom.js";
import { LossChart } from "../chart.js";

const EVENTS_SHOWN = 200;
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

function summary(j) {
  const p = j.progress || {};
  const step = p.step !== undefined ? `${p.step}${p.total_steps ? ` / ${p.total_steps}` : ""}` : "—";
  const eta = j.estimated_finish && !TERMINAL.has(j.status) ? when(j.estimated_finish) : "—";
  return table(["Status", "State", "Method", "Base", "Step", "ETA", "Created", "Finished", "Model"], [[
    statusBadge(j.status), j.state || "", (j.method && j.method.whetstone && j.method.whetstone.method) || "", j.model, step, eta,
    when(j.created_at), when(j.finished_at), j.fine_tuned_model || "—"]], { props: { id: "job-summary" } });
}

function verdict(ev) {
  if (!ev) return h("p", { class: "muted" }, "No eval verdict yet.");
  const stages = (ev.stages || []).map((s) => h("section", { class: "panel" },
    h("h3", {}, `${s.name}: `, h("span", { class: s.status === "passed" ? "ok" : s.status === "failed" ? "bad" : "muted" }, s.status)),
    h("p", {}, s.reason || ""),
    (s.metrics || []).length ? metricTable(s.metrics) : null));
  return h("div", { id: "eval" },
    h("p", {}, "Verdict: ", h("strong", { class: ev.verdict === "passed" ? "ok" : "bad" }, ev.verdict || "—")),
    (ev.reasons || []).length ? h("ul", {}, ev.reasons.map((r) => h("li", {}, r))) : null,
    stages.length ? stages : (ev.metrics || []).length ? metricTable(ev.metrics) : null);
}

function metricsText(metrics) {
  return Object.entries(metrics || {}).filter(([k, v]) => typeof v === "number" && k !== "step" && !k.startsWith("full_"))
    .map(([k, v]) => `${k}=${num(v)}`).join(", ");
}

function metricTable(metrics) {
  return table(["Metric", "Candidate", "Base", "Previous accepted", "Better is"], metrics.map((m) => [
    m.name, num(m.candidate), num(m.base), num(m.last_accepted), m.higher_is_better ? "higher" : "lower"]), { numeric: [1, 2, 3] });
}

// The job's own path, also asked for early by app.js while the session is being checked.
export function jobPath(id) {
  return `/v1/fine_tuning/jobs/${encodeURIComponent(id)}`;
}

export async function page(main, { id }, ctx) {
  let job = await api(jobPath(id));
  const head = h("div");
  const chart = new LossChart();
  const events = h("ol", { id: "events", reversed: true, "aria-label": "Events, newest first" });
  const checkpoints = h("div", { id: "checkpoints" });
  const evalBox = h("div");
  const resolved = h("div");
  const actions = h("div", { class: "row", id: "job-actions" });
  let showMetrics = false;
  const metricsToggle = h("input", { type: "checkbox", id: "show-metrics" });
  metricsToggle.addEventListener("change", () => { showMetrics = metricsToggle.checked; events.classList.toggle("with-metrics", showMetrics); });
  main.append(h("h1", {}, "Job ", h("span", { class: "mono" }, job.id),
                job.user_provided_suffix ? h("span", { class: "muted" }, " · ", job.user_provided_suffix) : null),
    head, actions,
    h("h2", {}, "Loss"), h("p", { class: "legend" }, h("span", { class: "train" }, "— training loss"),
                           h("span", { class: "valid" }, "- - validation loss")), chart.el,
    h("h2", {}, "Eval verdict"), evalBox, h("h2", {}, "Checkpoints"), checkpoints,
    h("h2", {}, "Resolved hyperparameters"), resolved,
    h("h2", {}, "Events"), h("p", {}, metricsToggle, h("label", { for: "show-metrics", style: null, class: "inline" }, " show per-step metrics")), events);

  function render() {
    append(clear(head), summary(job), job.error ? h("p", { class: "bad", role: "alert" }, `${job.error.code || "error"}: ${job.error.message || ""}`) : null);
    clear(evalBox).append(verdict(job.eval));
    clear(resolved).append(job.resolved_hyperparameters ? jsonBlock(job.resolved_hyperparameters) : h("p", { class: "muted" }, "Resolved when the job is admitted."));
    clear(actions);
    if (ctx.canWrite && !TERMINAL.has(job.status) && job.state !== "evaluating") {
      actions.append(h("button", { class: "danger", type: "button", id: "cancel-job", onclick: () => act("cancel") }, "Cancel"));
      if (job.status === "paused") actions.append(h("button", { type: "button", onclick: () => act("resume") }, "Resume"));
      else if (job.status === "running") actions.append(h("button", { class: "secondary", type: "button", onclick: () => act("pause") }, "Pause"));
    }
  }
  async function act(what) {
    try { job = await api(`/v1/fine_tuning/jobs/${encodeURIComponent(job.id)}/${what}`, { method: "POST" }); render(); }
    catch (err) { notice(`${what} refused: ${err.message}`, true); }
  }
  async function reloadJob() {
    try { job = await api(`/v1/fine_tuning/jobs/${encodeURIComponent(id)}`); render(); } catch { /* the stream goes on */ }
  }
  async function reloadCheckpoints() {
    try {
      const page = await api(`/v1/fine_tuning/jobs/${encodeURIComponent(id)}/checkpoints?limit=100`);
      clear(checkpoints).append(page.data.length ? table(["Step", "Kind", "Checkpoint", "Metrics", "Written"], page.data.map((c) => [
        c.step_number, c.kind || "", c.fine_tuned_model_checkpoint, metricsText(c.metrics), when(c.created_at)]), { numeric: [0] })
        : h("p", { class: "muted" }, "No checkpoint yet."));
    } catch { /* shown on the next event */ }
  }

  let reloadQueued = false, headQueued = false;
  const close = jobEvents(id, (ev) => {
    const d = ev.data || {};
    if (ev.type === "metrics") {
      chart.add(d.step, d.loss, d.validation_loss);
      if (d.step !== undefined) {
        job.progress = { ...(job.progress || {}), ...d };
        if (!headQueued) {
          headQueued = true;
          requestAnimationFrame(() => { headQueued = false; clear(head).append(summary(job)); });
        }
      }
    }
    const item = h("li", { class: ev.type === "metrics" ? "metric-event" : "event" },
                   h("span", { class: "muted" }, when(ev.created_at), " "), `[${ev.level}] ${ev.message}`);
    events.prepend(item);
    while (events.childElementCount > EVENTS_SHOWN) events.lastElementChild.remove();
    if (ev.type !== "metrics" && !reloadQueued) {   // a state change: the job object and its checkpoints once per burst
      reloadQueued = true;
      setTimeout(() => { reloadQueued = false; reloadJob(); reloadCheckpoints(); }, 250);
    }
  }, () => { reloadJob(); reloadCheckpoints(); });
  render();
  reloadCheckpoints();
  return close;
}

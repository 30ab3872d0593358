// The operator view (a `platform` admin key): the queue by tier, the nodes and the GPUs their jobs hold,
// dead letters per topic with redrive. Every figure comes from the scheduler's /v1/operator routes, which
// answer the platform's operator only: any other key gets 403 and this page says so, showing nothing.
import { api, ApiError } from "../api.js";
import { h, when, num, table } from "../dom.js";

function seconds(s) {
  if (s === null || s === undefined) return "—";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function denied(main, err) {
  main.append(h("p", { class: "bad", role: "alert", id: "operator-denied" },
    err.status === 403 || err.status === 404
      ? "This page is for the platform's operator (an admin key of the `platform` tenant). The API refused this key: "
        + err.message
      : `Could not load the operator view: ${err.message}`));
}

export async function page(main) {
  main.append(h("h1", {}, "Operator"));
  let queue, nodes, letters;
  try {
    queue = await api("/v1/operator/queue");   // first alone: a tenant's key asks nothing more
    [nodes, letters] = await Promise.all([api("/v1/operator/nodes"), api("/v1/operator/dead_letters")]);
  } catch (err) {
    if (err instanceof ApiError && err.status !== 401) { denied(main, err); return; }
    throw err;
  }
  main.append(h("h2", {}, "Queue by tier"), h("p", { class: "muted" }, `Order: ${queue.ordering}; tiers highest first.`),
    table(["Tier", "Queued", "On nodes", "Longest wait", "Wait target"], queue.tiers.map((t) => [
      t.tier, num(t.queued), num(t.active), seconds(t.oldest_wait_s), t.wait_target_s === null ? "best effort" : seconds(t.wait_target_s)]),
      { numeric: [1, 2], props: { id: "queue-table" } }));

  main.append(h("h2", {}, "Nodes"), nodes.data.length ? table(
    ["Node", "GPU type", "GPUs in use", "GPU memory", "Spot", "State", "Last heartbeat", "Jobs"], nodes.data.map((n) => [
      h("code", {}, n.id), n.gpu_type, `${n.gpus_in_use} / ${n.gpu_count}`, n.gpu_memory_gb ? `${num(n.gpu_memory_gb, 3)} GB` : "—",
      n.spot ? "spot" : "on-demand", h("span", { class: n.state === "ready" ? "ok" : "bad" }, n.state), when(n.last_seen),
      n.jobs.length ? n.jobs.map((j, i) => [i ? ", " : "", h("code", {}, j)]) : "—"]), { props: { id: "nodes-table" } })
    : h("p", { class: "muted" }, "No node has sent a heartbeat."));

  const out = h("p", { role: "status", id: "redrive-result" });
  const total = letters.data.reduce((n, t) => n + t.letters, 0);
  const held = letters.data.filter((t) => t.letters > 0);
  main.append(h("h2", {}, "Dead letters"),
    h("p", { class: "muted" }, `${num(total)} letters in ${held.length} of ${letters.data.length} topics. A redriven letter is put back on ` +
      "its topic and handled once through the consumer's inbox; it stays listed here (topics are append-only)."),
    table(["Topic", "Letters", "Replayable", ""], [...held, ...letters.data.filter((t) => !t.letters)].map((t) => [
      h("code", {}, t.id), num(t.letters), num(t.replayable),
      t.replayable ? h("button", { class: "secondary", type: "button", "data-topic": t.id, "aria-label": `Redrive ${t.id}`,
                                   onclick: (e) => redrive(t.id, e.currentTarget) }, "Redrive") : ""]),
      { numeric: [1, 2], props: { id: "dlq-table" } }), out);

  async function redrive(topic, button) {
    button.disabled = true;
    try {
      const r = await api(`/v1/operator/dead_letters/${encodeURIComponent(topic)}/redrive`, { method: "POST" });
      out.textContent = `Redriven ${r.redriven} letter(s) to ${r.topic}; skipped ${r.skipped.length}` +
        (r.skipped.length ? ` (${r.skipped.map((s) => `#${s.dlq_offset}: ${s.reason}`).join("; ")})` : "") + ".";
    } catch (err) { out.textContent = `Redrive refused: ${err.message}`; }
    finally { button.disabled = false; }
  }
}

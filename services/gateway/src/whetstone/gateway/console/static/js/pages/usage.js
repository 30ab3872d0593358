// Usage: the month's invoice (GET /v1/usage), each job's metered lines, GPU-seconds per day as bars.
import { api, query } from "../api.js";
import { h, svg, num, table, field } from "../dom.js";

function dayChart(days) {
  const entries = [...days.entries()].sort();
  const W = 720, H = 200, pad = 40;
  const max = Math.max(1, ...entries.map(([, v]) => v));
  const bw = entries.length ? (W - 2 * pad) / entries.length : 0;
  return svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", id: "usage-chart",
                      "aria-label": `GPU-seconds per day: ${entries.map(([d, v]) => `${d} ${v.toFixed(0)}`).join(", ") || "none"}` },
    svg("line", { class: "axis", x1: pad, y1: H - pad, x2: W - pad, y2: H - pad }),
    svg("text", { x: pad - 4, y: pad, "text-anchor": "end" }, num(max, 3)),
    entries.map(([d, v], i) => [
      svg("rect", { x: pad + i * bw + 2, y: H - pad - ((H - 2 * pad) * v) / max, width: Math.max(1, bw - 4),
                    height: ((H - 2 * pad) * v) / max, fill: "#0b4f9c" }, svg("title", {}, `${d}: ${v.toFixed(1)} GPU-s`)),
      svg("text", { x: pad + i * bw + bw / 2, y: H - pad + 14, "text-anchor": "middle" }, d.slice(5))]));
}

export async function page(main, { params }) {
  const month = params.get("month") || new Date().toISOString().slice(0, 7);
  const monthIn = h("input", { type: "month", name: "month", value: month });
  const form = h("form", { class: "row", "aria-label": "Month" }, field("Month", monthIn), h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (e) => { e.preventDefault(); location.hash = `#/usage${query({ month: monthIn.value })}`; });
  main.append(h("h1", {}, "Usage"), form);
  const inv = await api(`/v1/usage${query({ month })}`);
  main.append(table(["Jobs", "Succeeded", "Failed", "Cancelled", "GPU hours", "Billable GPU hours", "Spend (USD)", "Refunded (USD)", "Under review (USD)"],
    [[num(inv.jobs), num(inv.succeeded), num(inv.failed), num(inv.cancelled), num(inv.gpu_hours), num(inv.billable_gpu_hours),
      num(inv.spend), num(inv.refunded), num(inv.under_review)]], { numeric: [0, 1, 2, 3, 4, 5, 6, 7, 8] }));
  // per-job lines: the tenant's jobs of the month, each asked for its metered usage
  const jobs = (await api("/v1/fine_tuning/jobs?limit=100")).data.filter((j) => new Date(j.created_at * 1000).toISOString().slice(0, 7) === month);
  const days = new Map();
  const rows = [];
  for (const j of jobs) {
    let u;
    try { u = await api(`/v1/usage/jobs/${encodeURIComponent(j.id)}`); } catch { continue; }
    const lines = u.lines || u.entries || [];
    for (const l of lines) {
      const day = String(l.created_at || "").slice(0, 10);
      if (day) days.set(day, (days.get(day) || 0) + (Number(l.gpu_seconds) || 0));
    }
    const t = u.total || {};
    rows.push([h("a", { href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id), num(t.gpu_seconds), num(t.billable_gpu_seconds),
               num(t.cost), t.charge_class || "—", lines.filter((l) => l.charge_class === "refunded").map((l) => l.basis || "refunded").join("; ")]);
  }
  main.append(h("h2", {}, "GPU-seconds per day"), dayChart(days), h("h2", {}, "Invoice by job"),
    rows.length ? table(["Job", "GPU-s", "Billable GPU-s", "Cost (USD)", "Class", "Refunds"], rows, { numeric: [1, 2, 3] })
      : h("p", { class: "muted" }, "No metered job this month."));
}

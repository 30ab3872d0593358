// The validation report of one file, readable: counts, errors and warnings with their line numbers
// and the offending rows, duplicates, PII, the token and cost estimate. Issue lists are shown a page
// at a time, so a report with 100,000 warnings renders as fast as one with ten.
import { h, clear, num, table } from "./dom.js";

export const PAGE = 50;
const SAMPLE_CHARS = 400;

function issueTable(title, issues, total, sampleLine) {
  const wrap = h("section", { class: "issues", "aria-label": title });
  let page = 0;
  const pages = Math.max(1, Math.ceil(issues.length / PAGE));
  const body = h("div");
  const status = h("span", { class: "muted", "aria-live": "polite" });
  const prev = h("button", { class: "secondary", type: "button", onclick: () => show(page - 1) }, "Previous");
  const next = h("button", { class: "secondary", type: "button", onclick: () => show(page + 1) }, "Next");
  function show(p) {
    page = Math.min(Math.max(0, p), pages - 1);
    const slice = issues.slice(page * PAGE, (page + 1) * PAGE);
    clear(body).append(table(["Line", "Code", "Field", "Message", "Row"], slice.map((i) => {
      const sample = i.line ? sampleLine(i.line) : null;
      return [i.line ?? "—", h("code", {}, i.code ?? ""), i.field ?? "", i.message ?? "",
              sample === null ? h("span", { class: "muted" }, "—") : h("code", { class: "sample" }, sample)];
    }), { numeric: [0] }));
    status.textContent = `${title}: ${issues.length.toLocaleString("en")} listed` +
      (total > issues.length ? ` of ${total.toLocaleString("en")}` : "") + ` · page ${page + 1} of ${pages}`;
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }
  wrap.append(h("h2", {}, `${title} (${total.toLocaleString("en")})`), h("div", { class: "pager" }, prev, next, status), body);
  show(0);
  return wrap;
}

function costTable(cost) {
  if (!cost || !Array.isArray(cost.estimates)) return null;
  return h("section", {}, h("h2", {}, "Token and cost estimate"),
    h("p", {}, `${num(cost.tokens)} tokens × ${num(cost.epochs)} epochs = ${num(cost.tokens_x_epochs)} trained tokens` +
               (cost.tokens_estimated ? " (estimated without the base model's tokenizer)" : "")),
    table(["GPU", "Method", "GPU hours", "On demand (USD)", "Spot (USD)"],
          cost.estimates.slice(0, 12).map((e) => [e.gpu_type, e.method, num(e.gpu_hours), num(e.on_demand_usd), num(e.spot_usd)]),
          { numeric: [2, 3, 4] }));
}

// `lines`: the file's text split in lines when it was small enough to read, else null.
export function renderReport(container, file, lines = null) {
  clear(container);
  const v = file.validation;
  if (!v) {
    container.append(h("p", { class: "muted" }, file.status === "uploaded"
      ? "Validation is running; this page updates when you reload it." : "No validation report."));
    return container;
  }
  const sampleLine = (n) => (lines && n >= 1 && n <= lines.length ? lines[n - 1].slice(0, SAMPLE_CHARS) : null);
  const stats = v.stats || {};
  const verdict = v.status === "accepted" ? h("span", { class: "ok" }, "accepted") : h("span", { class: "bad" }, v.status ?? "—");
  container.append(
    h("h2", {}, "Validation report: ", verdict),
    table(["Rows", "Kept", "Errors", "Warnings", "Tokens", "Format", "Schema"],
          [[num(v.rows_total), num(v.rows_kept), num(v.error_count ?? (v.errors || []).length),
            num(warningTotal(v)), num(v.tokens_total), v.format ?? "—", v.schema ?? "—"]], { numeric: [0, 1, 2, 3, 4] }));
  const findings = [["Exact duplicates", stats.exact_duplicates], ["Near duplicates", stats.near_duplicates],
                    ["Rows with personal data (PII)", stats.pii_hits], ["Contaminated (eval overlap)", stats.contaminated],
                    ["Toxic", stats.toxic], ["Training rows", stats.train_rows], ["Validation rows", stats.validation_rows]]
    .filter(([, n]) => n !== undefined && n !== null);
  if (findings.length) container.append(h("h2", {}, "Findings"), table(["Check", "Rows"], findings.map(([k, n]) => [k, num(n)]), { numeric: [1] }));
  if (stats.pii_by_kind && Object.keys(stats.pii_by_kind).length)
    container.append(table(["PII kind", "Found"], Object.entries(stats.pii_by_kind).map(([k, n]) => [k, num(n)]), { numeric: [1] }));
  if (Array.isArray(stats.near_dup_clusters) && stats.near_dup_clusters.length)
    container.append(h("h2", {}, "Near-duplicate clusters (first ones)"),
      h("ul", {}, stats.near_dup_clusters.slice(0, 10).map((c) => h("li", {}, typeof c === "object" ? JSON.stringify(c) : String(c)))));
  const errors = Array.isArray(v.errors) ? v.errors : [];
  const warnings = Array.isArray(v.warnings) ? v.warnings : [];
  if (errors.length) container.append(issueTable("Errors", errors, v.error_count ?? errors.length, sampleLine));
  if (warnings.length) container.append(issueTable("Warnings", warnings, warningTotal(v), sampleLine));
  const cost = costTable(v.cost_estimate);
  if (cost) container.append(cost);
  return container;
}

function warningTotal(v) {
  const counts = (v.stats || {}).warning_counts;
  const counted = counts && typeof counts === "object" ? Object.values(counts).reduce((a, b) => a + (Number(b) || 0), 0) : 0;
  return Math.max(counted, (v.warnings || []).length);
}

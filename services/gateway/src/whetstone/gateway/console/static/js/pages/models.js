// Models: versions by name and stage, one model's lineage and stage history, promote / roll back /
// archive with a reason (the registry decides what each key may do and says why when it refuses); the
// A/B routes that split a name's traffic between versions, with the requests each version served.
import { api, query } from "../api.js";
import { h, append, when, num, table, field, notice, jsonBlock } from "../dom.js";

const STAGES = ["", "dev", "staging", "production", "archived", "quarantined"];

export async function list(main, { params }) {
  const name = params.get("name") || "";
  const stage = params.get("stage") || "";
  main.append(h("h1", {}, "Models"));
  const nameIn = h("input", { type: "search", name: "name", value: name });
  const stageSel = h("select", { name: "stage" }, STAGES.map((s) => h("option", { value: s, selected: s === stage }, s || "any")));
  const form = h("form", { class: "row", role: "search", "aria-label": "Filter models" }, field("Name", nameIn), field("Stage", stageSel),
                 h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (e) => { e.preventDefault(); location.hash = `#/models${query({ name: nameIn.value.trim(), stage: stageSel.value })}`; });
  main.append(form);
  const page = await api(`/v1/models${query({ name: name || null, limit: 200, after: params.get("after") })}`);
  const shown = page.data.filter((m) => !stage || m.stage === stage);
  main.append(shown.length ? table(["Model", "Name", "Stage", "Job", "Created"], shown.map((m) => [
    m.stage ? h("a", { href: `#/models/${encodeURIComponent(m.id)}` }, m.id) : m.id, m.name || "", m.stage || "base model",
    m.job_id ? h("a", { href: `#/jobs/${encodeURIComponent(m.job_id)}` }, m.job_id) : "—", when(m.created)]), { props: { id: "models-table" } })
    : h("p", { class: "muted" }, "No models match."));
  if (page.has_more) main.append(h("p", {}, h("a", { href: `#/models${query({ name, stage, after: page.last_id })}` }, "Next page")));
  main.append(await abRoutes(null));
}

// The tenant's A/B routes (serving): each route's versions with their share of the traffic and the requests
// each served (counted by the serving replica since it started). `ids`: only routes sending one of them traffic.
async function abRoutes(ids) {
  const box = h("section", { "aria-label": "A/B routes", id: "ab-routes" }, h("h2", {}, "A/B routes"));
  let routes;
  try { routes = (await api("/v1/serving/routes")).data; }
  catch (err) { return append(box, h("p", { class: "muted" }, `A/B routes unavailable: ${err.message}`)); }
  routes = routes.filter((r) => !ids || r.variants.some((v) => ids.includes(v.model)));
  if (!routes.length) return append(box, h("p", { class: "muted" }, ids ? "No A/B route sends traffic to this version." :
    "No A/B routes. Create one with PUT /v1/serving/routes/{name} (a models:promote key)."));
  const rows = [];
  for (const r of routes) {
    const weight = r.variants.reduce((n, v) => n + v.weight, 0) || 1;
    const served = r.variants.reduce((n, v) => n + v.requests, 0);
    r.variants.forEach((v, i) => rows.push([i ? "" : h("code", {}, r.name),
      h("a", { href: `#/models/${encodeURIComponent(v.model)}` }, v.model), `${(100 * v.weight / weight).toFixed(1)} %`,
      num(v.requests), served ? `${(100 * v.requests / served).toFixed(1)} %` : "—"]));
  }
  return append(box, table(["Route", "Version", "Traffic split", "Requests", "Share served"], rows,
                           { numeric: [2, 3, 4], props: { id: "routes-table" } }));
}

export async function detail(main, { id }, ctx) {
  const m = await api(`/v1/models/${encodeURIComponent(id)}`);
  main.append(h("h1", {}, "Model ", h("span", { class: "mono" }, m.id)),
    table(["Name", "Stage", "Job", "Created", "Artifact sha256"], [[m.name, h("strong", { id: "model-stage" }, m.stage),
      m.job_id ? h("a", { href: `#/jobs/${encodeURIComponent(m.job_id)}` }, m.job_id) : "—", when(m.created), h("code", {}, m.artifact_sha256 || "—")]]));
  if (ctx.canWrite) main.append(stageForm(m, ctx));
  main.append(h("p", {}, h("a", { href: `#/playground?model=${encodeURIComponent(m.id)}` }, "Try it in the playground"), " · ",
                h("button", { class: "secondary", type: "button", onclick: download }, "Download link")));
  main.append(h("h2", {}, "Lineage and model card"), m.lineage ? table(["Field", "Value"], Object.entries(m.lineage).map(([k, v]) =>
    [k, typeof v === "object" && v !== null ? h("details", {}, h("summary", {}, Array.isArray(v) ? `${v.length} items` : "show"),
                                                h("pre", {}, JSON.stringify(v, null, 1)))
       : String(v ?? "—")])) : h("p", { class: "muted" }, "—"));
  main.append(await abRoutes([m.id, m.model_id]));
  main.append(h("h2", {}, "Stage history"), table(["From", "To", "Reason", "By", "At"], (m.stage_history || []).map((s) =>
    [s.from_stage ?? "—", s.to_stage ?? s.stage ?? "—", s.reason ?? "", s.actor ?? "", s.at ?? s.created_at ?? ""])));

  async function download() {
    try { const d = await api(`/v1/models/${encodeURIComponent(m.id)}/download`); main.append(h("h2", {}, "Download"), jsonBlock(d)); }
    catch (err) { notice(`No download: ${err.message}`, true); }
  }
}

function stageForm(m, ctx) {
  const stage = h("select", { name: "stage", id: "promote-stage" }, ["staging", "production", "dev"].map((s) => h("option", { value: s }, s)));
  const reason = h("input", { name: "reason", id: "stage-reason", required: true, maxlength: "2000" });
  const out = h("p", { role: "status" });
  async function change(path, body) {
    if (!reason.value.trim()) { out.textContent = "A reason is required."; reason.focus(); return; }
    try {
      const r = await api(`/v1/models/${encodeURIComponent(m.id)}/${path}`, { method: "POST", body });
      out.textContent = `Done: ${r.id} is now ${r.stage}.`;
      document.getElementById("model-stage").textContent = r.stage;
    } catch (err) { out.textContent = `Refused: ${err.message}`; }
  }
  const form = h("form", { class: "panel", "aria-label": "Change stage" }, h("h2", {}, "Change stage"),
    h("div", { class: "row" }, field("Target stage", stage), field("Reason", reason)),
    h("div", { class: "row" }, h("button", { type: "submit", id: "promote" }, "Promote"),
      ctx.canPromote ? h("button", { class: "secondary", type: "button", onclick: () => change("rollback", { reason: reason.value.trim() }) }, "Roll back") : null,
      h("button", { class: "danger", type: "button", onclick: () => change("archive", { reason: reason.value.trim() }) }, "Archive")), out);
  form.addEventListener("submit", (e) => { e.preventDefault(); change("promote", { stage: stage.value, reason: reason.value.trim() }); });
  return form;
}

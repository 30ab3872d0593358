// Jobs: the list (filter, pages) and the create form for every method the API accepts.
import { api, query } from "../api.js";
import { h, append, clear, when, table, statusBadge, field, jsonBlock } from "../dom.js";

const STATUSES = ["", "validating_files", "queued", "running", "succeeded", "failed", "cancelled", "paused"];
export const METHODS = [
  ["lora", "supervised", "LoRA (supervised)"], ["qlora", "supervised", "QLoRA, 4-bit base (supervised)"],
  ["full", "supervised", "Full fine-tune (supervised)"], ["cpt", "supervised", "Continued pre-training (plain text)"],
  ["dpo", "dpo", "DPO (preference pairs)"], ["orpo", "dpo", "ORPO (preference pairs)"],
];
const KNOBS = [   // [name, label, type, step, applies to]
  ["n_epochs", "Epochs", "number", "1", null], ["batch_size", "Batch size", "number", "1", null],
  ["learning_rate_multiplier", "Learning-rate multiplier", "number", "any", null],
  ["gradient_accumulation_steps", "Gradient accumulation steps", "number", "1", null],
  ["max_seq_len", "Max sequence length", "number", "1", null], ["warmup_ratio", "Warm-up ratio", "number", "any", null],
  ["checkpoint_every_steps", "Checkpoint every N steps", "number", "1", null],
  ["lora_r", "LoRA rank", "number", "1", ["lora", "qlora", "dpo", "orpo"]],
  ["lora_alpha", "LoRA alpha", "number", "1", ["lora", "qlora", "dpo", "orpo"]],
  ["lora_dropout", "LoRA dropout", "number", "any", ["lora", "qlora", "dpo", "orpo"]],
  ["beta", "Beta (DPO) / lambda (ORPO)", "number", "any", ["dpo", "orpo"]],
];

// The list's first request, also asked for early by app.js while the session is being checked.
export function listPath(params) {
  return `/v1/fine_tuning/jobs${query({ limit: 50, after: params.get("after") })}`;
}

export async function list(main, { params }, ctx) {
  const status = params.get("status") || "";
  const text = params.get("q") || "";
  const after = params.get("after");
  main.append(h("h1", {}, "Fine-tuning jobs"));
  if (ctx.canWrite) main.append(h("p", {}, h("a", { href: "#/jobs/new", id: "new-job" }, "Create a job")));
  const statusSel = h("select", { name: "status" }, STATUSES.map((s) => h("option", { value: s, selected: s === status }, s || "any")));
  const search = h("input", { type: "search", name: "q", value: text, placeholder: "id, base model or suffix" });
  const filter = h("form", { class: "row", role: "search", "aria-label": "Filter jobs" }, field("Status", statusSel),
                   field("Search", search), h("button", { type: "submit" }, "Filter"));
  filter.addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = `#/jobs${query({ status: statusSel.value, q: search.value.trim() })}`;
  });
  main.append(filter);
  const page = await api(listPath(params));
  const needle = text.toLowerCase();
  const shown = page.data.filter((j) => (!status || j.status === status) &&
    (!needle || [j.id, j.model, j.user_provided_suffix].some((v) => String(v || "").toLowerCase().includes(needle))));
  main.append(shown.length ? table(["Job", "Suffix", "Status", "Method", "Base", "Created", "Finished"], shown.map((j) => [
    h("a", { href: `#/jobs/${encodeURIComponent(j.id)}` }, j.id), j.user_provided_suffix || "", statusBadge(j.status),
    (j.method && j.method.whetstone && j.method.whetstone.method) || (j.method && j.method.type) || "", j.model,
    when(j.created_at), when(j.finished_at)]), { props: { id: "jobs-table" } })
    : h("p", { class: "muted" }, page.data.length ? "No job on this page matches the filter." : "No jobs yet."));
  main.append(h("div", { class: "pager" },
    after ? h("a", { href: `#/jobs${query({ status, q: text })}` }, "First page") : null,
    page.has_more ? h("a", { href: `#/jobs${query({ status, q: text, after: page.last_id })}` }, "Next page") : null));
}

function knobInput([name, , type, step]) {
  return h("input", { type, step, min: "0", name, inputmode: "decimal" });
}

export async function create(main, { params }, ctx) {
  main.append(h("h1", {}, "Create a fine-tuning job"));
  if (!ctx.canWrite) { main.append(h("p", {}, "This key has no write scope: it cannot create jobs.")); return; }
  const [bases, files, templates] = await Promise.all([
    api("/v1/base_models").catch(() => ({ data: [] })), api("/v1/files?limit=200"), api("/v1/templates").catch(() => ({ data: [] }))]);
  const usable = files.data.filter((f) => f.status === "processed");
  const model = h("input", { name: "model", list: "base-models", autocomplete: "off", value: bases.data.length === 1 ? bases.data[0].id : "",
                             placeholder: "a base model (empty: the template's)" });
  const baseList = h("datalist", { id: "base-models" }, bases.data.map((b) => h("option", { value: b.id })));
  const template = h("select", { name: "template" }, h("option", { value: "" }, "(none)"),
                     templates.data.map((t) => h("option", { value: `${t.name}@${t.version}` }, `${t.name} v${t.version}`)));
  const fileOptions = (sel) => usable.map((f) => h("option", { value: f.id, selected: f.id === sel }, `${f.filename} (${f.id})`));
  const training = h("select", { name: "training_file", required: true }, fileOptions(params.get("training_file")));
  const validation = h("select", { name: "validation_file" }, h("option", { value: "" }, "(split from the training file)"), fileOptions(null));
  const method = h("select", { name: "method" }, METHODS.map(([m, , label]) => h("option", { value: m }, label)));
  const suffix = h("input", { name: "suffix", maxlength: "64" });
  const seed = h("input", { name: "seed", type: "number", min: "0", step: "1" });
  const evalConfig = h("textarea", { name: "eval_config", rows: "2", placeholder: '{"stages": ["holdout", "safety"]}' });
  const knobs = Object.fromEntries(KNOBS.map((k) => [k[0], knobInput(k)]));
  const knobFields = KNOBS.map((k) => [k, field(k[1], knobs[k[0]])]);
  const preview = h("div", { id: "preview", "aria-live": "polite" });
  const error = h("p", { class: "bad", role: "alert" });

  function body() {
    const m = method.value;
    const family = METHODS.find((x) => x[0] === m)[1];
    const hp = {};
    for (const [k, applies] of KNOBS.map((x) => [x[0], x[4]])) {
      const v = knobs[k].value.trim();
      if (v !== "" && (!applies || applies.includes(m))) hp[k] = Number(v);
    }
    const out = { training_file: training.value,
                  method: { type: family, [family]: { hyperparameters: hp }, whetstone: { method: m } } };
    if (model.value.trim()) out.model = model.value.trim();
    if (template.value) out.template = template.value;
    if (validation.value) out.validation_file = validation.value;
    if (suffix.value.trim()) out.suffix = suffix.value.trim();
    if (seed.value.trim()) out.seed = Number(seed.value);
    if (evalConfig.value.trim()) {
      try { out.eval_config = JSON.parse(evalConfig.value); } catch { out.eval_config = "(not valid JSON)"; }
    }
    return out;
  }
  function refresh() {
    const m = method.value;
    for (const [k, el] of knobFields) el.hidden = !!(k[4] && !k[4].includes(m));
    const chosen = templates.data.find((t) => `${t.name}@${t.version}` === template.value);
    append(clear(preview), h("h2", {}, "What will be sent"), jsonBlock(body()),
      chosen ? h("div", {}, h("h2", {}, `Template ${chosen.name} v${chosen.version} gives`), jsonBlock(chosen.fields || chosen)) : null,
      h("p", { class: "muted" }, "Knobs left empty take the platform's defaults for this base model and method; the job page " +
        "shows the full resolved set once the job is admitted."));
  }
  const form = h("form", { "aria-label": "New job" },
    h("div", { class: "grid" }, field("Base model", model), baseList, field("Template", template), field("Training file", training),
      field("Validation file", validation), field("Method", method), field("Suffix (name)", suffix), field("Seed", seed),
      field("Eval config (JSON)", evalConfig, "the eval gate's stages and thresholds for this job; empty: the tenant's defaults")),
    h("h2", {}, "Hyperparameters"), h("div", { class: "grid" }, knobFields.map(([, el]) => el)),
    preview, h("p", {}, h("button", { type: "submit", id: "create-job" }, "Create job")), error);
  form.addEventListener("input", refresh);
  form.addEventListener("change", refresh);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    error.textContent = "";
    try {
      const job = await api("/v1/fine_tuning/jobs", { method: "POST", body: body() });
      location.hash = `#/jobs/${encodeURIComponent(job.id)}`;
    } catch (err) {
      error.textContent = `Refused${err.param ? ` (${err.param})` : ""}: ${err.message}`;
    }
  });
  main.append(usable.length ? form : h("p", {}, "No validated training file yet: ", h("a", { href: "#/files" }, "upload one"), "."));
  refresh();
}

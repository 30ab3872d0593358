// Files: the list, a drag-and-drop upload with progress, and one file's validation report.
import { api, upload, query } from "../api.js";
import { h, when, bytes, table, statusBadge, notice, field } from "../dom.js";
import { renderReport } from "../report.js";

const SAMPLE_MAX_BYTES = 4 << 20;   // the file's own rows are shown beside its issues up to this size

function uploader(onDone) {
  const input = h("input", { type: "file", accept: ".jsonl,.json,.csv,.parquet,.txt", class: "visually-plain" });
  const purpose = h("select", {}, h("option", { value: "fine-tune" }, "fine-tune"));
  const bar = h("progress", { max: 100, value: 0, "aria-label": "Upload progress", hidden: true });
  const status = h("p", { "aria-live": "polite", id: "upload-status" });
  const zone = h("div", { class: "drop", tabindex: "0", role: "button", id: "drop-zone",
                          "aria-label": "Drop a training file here, or press Enter to choose one" },
    h("p", {}, "Drop a training file here (JSONL), or ", h("strong", {}, "choose one"), "."));
  async function send(file) {
    if (!file) return;
    bar.hidden = false;
    bar.value = 0;
    status.textContent = `Uploading ${file.name} (${bytes(file.size)})…`;
    try {
      const f = await upload(file, purpose.value, (loaded, total) => {
        bar.value = total ? Math.round((loaded / total) * 100) : 0;
        status.textContent = `Uploading ${file.name}: ${bytes(loaded)} of ${bytes(total)}`;
      });
      bar.value = 100;
      status.textContent = `Uploaded ${f.filename} as ${f.id}; validating.`;
      onDone(f);
    } catch (err) {
      status.textContent = `Upload refused: ${err.message}`;
    }
  }
  zone.addEventListener("click", () => input.click());
  zone.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); input.click(); } });
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("over"); send(e.dataTransfer.files[0]); });
  input.addEventListener("change", () => send(input.files[0]));
  return h("section", { class: "panel", "aria-label": "Upload" }, h("h2", {}, "Upload"),
           field("Purpose", purpose), field("File", input), zone, bar, status);
}

export async function list(main, { params }, ctx) {
  main.append(h("h1", {}, "Files"));
  if (ctx.canWrite) main.append(uploader((f) => { location.hash = `#/files/${encodeURIComponent(f.id)}`; }));
  const after = params.get("after");
  const page = await api(`/v1/files${query({ limit: 25, after })}`);
  if (!page.data.length) { main.append(h("p", { class: "muted" }, "No files yet.")); return; }
  main.append(table(["File", "Name", "Status", "Size", "Uploaded"], page.data.map((f) => [
    h("a", { href: `#/files/${encodeURIComponent(f.id)}` }, f.id), f.filename, statusBadge(f.status), bytes(f.bytes), when(f.created_at)]),
    { props: { id: "files-table" } }));
  main.append(h("div", { class: "pager" },
    after ? h("a", { href: "#/files" }, "First page") : null,
    page.has_more ? h("a", { href: `#/files?after=${encodeURIComponent(page.last_id)}` }, "Next page") : null));
}

async function fileLines(f) {
  if (!f.bytes || f.bytes > SAMPLE_MAX_BYTES) return null;
  try {
    const r = await fetch(`/v1/files/${encodeURIComponent(f.id)}/content`, { credentials: "same-origin" });
    return r.ok ? (await r.text()).split("\n") : null;
  } catch { return null; }
}

export async function detail(main, { id }, ctx) {
  const f = await api(`/v1/files/${encodeURIComponent(id)}`);
  main.append(h("h1", {}, "File ", h("span", { class: "mono" }, f.filename)),
    table(["Id", "Status", "Purpose", "Size", "Uploaded"], [[f.id, statusBadge(f.status), f.dataset_purpose || f.purpose,
                                                             bytes(f.bytes), when(f.created_at)]]));
  if (f.status_details) main.append(h("p", { class: "bad", id: "status-details" }, f.status_details));
  const report = h("div", { id: "report" });
  main.append(report);
  renderReport(report, f, await fileLines(f));
  const actions = h("div", { class: "row" },
    h("button", { class: "secondary", type: "button", onclick: () => window.dispatchEvent(new Event("whet:reload")) }, "Reload"));
  if (ctx.canWrite && f.status === "processed")
    actions.append(h("a", { href: `#/jobs/new?training_file=${encodeURIComponent(f.id)}` }, "Fine-tune on this file"));
  if (ctx.canWrite) actions.append(h("button", { class: "danger", type: "button", onclick: async () => {
    if (!confirm(`Delete ${f.filename}?`)) return;
    try { await api(`/v1/files/${encodeURIComponent(f.id)}`, { method: "DELETE" }); location.hash = "#/files"; }
    catch (err) { notice(`Not deleted: ${err.message}`, true); }
  } }, "Delete"));
  main.append(actions);
}

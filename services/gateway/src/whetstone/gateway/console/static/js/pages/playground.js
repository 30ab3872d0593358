// Playground: one prompt, two streamed answers side by side, the fine-tuned model and its base
// (POST /v1/chat/completions with stream: true; the chunks are read as they arrive).
import { api, csrfToken } from "../api.js";
import { h, field } from "../dom.js";

async function stream(model, prompt, out, signal) {
  out.textContent = "";
  out.removeAttribute("data-done");
  const r = await fetch("/v1/chat/completions", {
    method: "POST", credentials: "same-origin", signal,
    headers: { "Content-Type": "application/json", Accept: "text/event-stream", "X-CSRF-Token": csrfToken() },
    body: JSON.stringify({ model, stream: true, max_tokens: 64, messages: [{ role: "user", content: prompt }] }) });
  if (!r.ok) {
    let msg = `HTTP ${r.status}`;
    try { msg = (await r.json()).error.message; } catch { /* keep the status */ }
    out.textContent = `Refused: ${msg}`;
    out.setAttribute("data-done", "refused");
    return;
  }
  const reader = r.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const line = buffer.slice(0, cut).replace(/^data: ?/, "");
      buffer = buffer.slice(cut + 2);
      if (line === "[DONE]") { out.setAttribute("data-done", "ok"); return; }
      try {
        const chunk = JSON.parse(line);
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) out.append(delta.content);
      } catch { /* a line that is not JSON: ignored */ }
    }
  }
}

export async function page(main, { params }) {
  main.append(h("h1", {}, "Playground"));
  const models = (await api("/v1/models?limit=200&lineage=true")).data.filter((m) => ["staging", "production", "dev"].includes(m.stage));
  const chosen = params.get("model");
  const model = h("select", { name: "model", id: "play-model" },
                  models.map((m) => h("option", { value: m.id, selected: m.id === chosen }, `${m.name} (${m.id}, ${m.stage})`)));
  const prompt = h("textarea", { name: "prompt", rows: "3", id: "play-prompt" });
  const left = h("pre", { id: "answer-model", "aria-live": "polite" });
  const right = h("pre", { id: "answer-base", "aria-live": "polite" });
  const leftTitle = h("h2", {}, "Fine-tuned");
  const rightTitle = h("h2", {}, "Base");
  let controller = null;
  const form = h("form", { "aria-label": "Prompt" }, field("Model", model), field("Message", prompt),
                 h("p", {}, h("button", { type: "submit", id: "play-send" }, "Send to both")));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    if (controller) controller.abort();
    controller = new AbortController();
    const m = models.find((x) => x.id === model.value);
    const base = m && m.lineage && m.lineage.base_model;
    leftTitle.textContent = `Fine-tuned: ${m ? m.id : "—"}`;
    rightTitle.textContent = `Base: ${base || "unknown"}`;
    const text = prompt.value;
    await Promise.all([stream(model.value, text, left, controller.signal).catch((err) => { left.textContent = err.message; }),
                       base ? stream(base, text, right, controller.signal).catch((err) => { right.textContent = err.message; })
                            : Promise.resolve()]);
  });
  main.append(models.length ? form : h("p", { class: "muted" }, "No model to try yet."),
              h("div", { class: "side" }, h("section", {}, leftTitle, left), h("section", {}, rightTitle, right)));
  return () => controller && controller.abort();
}

// Keys and webhooks of the tenant, for admin keys: list, create (the secret is shown once), revoke.
import { api } from "../api.js";
import { h, when, table, field, notice, jsonBlock } from "../dom.js";

export async function page(main, _route, ctx) {
  main.append(h("h1", {}, "API keys and webhooks"));
  if (!ctx.isAdmin) { main.append(h("p", {}, "Only admin keys manage keys and webhooks.")); return; }
  const keys = await api("/v1/keys");
  main.append(table(["Key", "Name", "Scopes", "Created", "Last used", "Revoked", ""], keys.data.map((k) => [
    h("code", {}, k.id || k.key_id), k.name || "", (k.scopes || []).join(", "), when(k.created_at), when(k.last_used_at),
    when(k.revoked_at), k.revoked_at ? "" : h("button", { class: "danger", type: "button", onclick: async () => {
      if (!confirm(`Revoke ${k.id || k.key_id}?`)) return;
      try { await api(`/v1/keys/${encodeURIComponent(k.id || k.key_id)}/revoke`, { method: "POST" }); location.reload(); }
      catch (err) { notice(`Not revoked: ${err.message}`, true); }
    } }, "Revoke")])));
  const name = h("input", { name: "name", maxlength: "200" });
  const scopes = ["read", "write", "models:promote", "admin"].map((s) => [s, h("input", { type: "checkbox", value: s, checked: s === "read" || s === "write", id: `scope-${s}` })]);
  const out = h("div", { "aria-live": "polite" });
  const form = h("form", { class: "panel", "aria-label": "New key" }, h("h2", {}, "New key"), field("Name", name),
    h("fieldset", {}, h("legend", {}, "Scopes"), scopes.map(([s, box]) => h("span", {}, box, h("label", { for: box.id, class: "inline" }, ` ${s} `)))),
    h("p", {}, h("button", { type: "submit" }, "Create key")), out);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      const k = await api("/v1/keys", { method: "POST", body: { name: name.value, scopes: scopes.filter(([, b]) => b.checked).map(([s]) => s) } });
      out.replaceChildren(h("p", {}, "Copy the key now; it is not shown again:"), h("pre", {}, k.key || ""));
    } catch (err) { out.replaceChildren(h("p", { class: "bad" }, `Refused: ${err.message}`)); }
  });
  main.append(form);
  try {
    const hooks = await api("/v1/webhooks");
    main.append(h("h2", {}, "Webhooks"), hooks.data && hooks.data.length ? jsonBlock(hooks.data) : h("p", { class: "muted" }, "No webhooks."));
  } catch (err) { main.append(h("p", { class: "muted" }, `Webhooks: ${err.message}`)); }
}

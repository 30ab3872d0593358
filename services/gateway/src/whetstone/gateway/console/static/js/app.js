// The console's shell: sign-in, navigation (hash routes), and the page in view.
import { api, ApiError, csrfToken, prefetch } from "./api.js";
import { h, clear, field, notice } from "./dom.js";
import * as files from "./pages/files.js";
import * as jobs from "./pages/jobs.js";
import * as job from "./pages/job.js";
import * as models from "./pages/models.js";
import * as usage from "./pages/usage.js";
import * as playground from "./pages/playground.js";
import * as keys from "./pages/keys.js";
import * as operator from "./pages/operator.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
let me = null;            // {tenant_id, key_id, scopes} of the session
let cleanup = null;       // closes the page's event stream when leaving it
let visits = 0;           // counts page renders; only the latest one's event stream stays open

const ROUTES = [
  [/^\/files$/, files.list], [/^\/files\/([^/]+)$/, files.detail],
  [/^\/jobs$/, jobs.list], [/^\/jobs\/new$/, jobs.create], [/^\/jobs\/([^/]+)$/, job.page],
  [/^\/models$/, models.list], [/^\/models\/([^/]+)$/, models.detail],
  [/^\/playground$/, playground.page], [/^\/usage$/, usage.page], [/^\/keys$/, keys.page], [/^\/operator$/, operator.page],
];

export function context() {
  const scopes = new Set(me ? me.scopes : []);
  return { me, canWrite: scopes.has("write") || scopes.has("admin"),
           canPromote: scopes.has("models:promote") || scopes.has("admin"), isAdmin: scopes.has("admin"),
           isOperator: !!me && me.tenant_id === "platform" && scopes.has("admin") };
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/jobs";
  const [path, qs] = raw.split("?");
  return { path, params: new URLSearchParams(qs || "") };
}

async function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  if (!me) return showSignIn();
  const { path, params } = parseHash();
  for (const a of nav.querySelectorAll("a")) {
    const target = a.getAttribute("href").slice(1);
    if (path === target || path.startsWith(`${target}/`)) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  notice("");
  for (const [pattern, render] of ROUTES) {
    const m = path.match(pattern);
    if (!m) continue;
    // each visit renders into its own element: a slow page left behind never writes into the next one
    const view = h("div", { class: "view", "data-route": location.hash });
    clear(main).append(view);
    const visit = ++visits;
    try {
      const done = await render(view, { id: m[1] ? decodeURIComponent(m[1]) : null, params }, context());
      if (typeof done === "function") {
        if (visit === visits) cleanup = done; else done();
      }
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 401)) {
        view.append(h("p", { class: "bad", role: "alert" }, `Could not load this page: ${err.message}`));
      }
    }
    if (visit === visits) view.setAttribute("data-ready", "");
    return;
  }
  clear(main).append(h("h1", {}, "Not found"), h("p", {}, "No console page at this address."));
}

function showSignedIn() {
  nav.hidden = false;
  for (const a of nav.querySelectorAll("[data-admin]")) a.hidden = !context().isAdmin;
  for (const a of nav.querySelectorAll("[data-operator]")) a.hidden = !context().isOperator;
  clear(who).append(h("span", {}, `tenant ${me.tenant_id} · key ${me.key_id} · ${me.scopes.join(", ")}`),
                    h("button", { class: "secondary", type: "button", id: "sign-out", onclick: signOut }, "Sign out"));
}

function showSignIn(message) {
  me = null;
  nav.hidden = true;
  clear(who);
  if (cleanup) { cleanup(); cleanup = null; }
  const input = h("input", { type: "password", name: "api_key", autocomplete: "off", required: true, spellcheck: "false" });
  const error = h("p", { class: "bad", role: "alert" }, message || "");
  const form = h("form", { class: "signin", "aria-label": "Sign in" },
    h("h1", {}, "Sign in"),
    h("p", {}, "Paste an API key (", h("code", {}, "whet keys create TENANT"), "). It is exchanged for a session " +
      "cookie that your browser's scripts cannot read; the key is not stored in this browser."),
    field("API key", input), h("p", {}, h("button", { type: "submit" }, "Sign in")), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const key = input.value;
    input.value = "";
    try {
      me = await api("/console/session", { method: "POST", body: { api_key: key } });
      showSignedIn();
      if (!location.hash || location.hash === "#/") location.hash = "#/jobs"; else route();
    } catch (err) {
      error.textContent = `Sign-in failed: ${err.message}`;
      input.focus();
    }
  });
  clear(main).append(form);
  input.focus();
}

async function signOut() {
  try { await api("/console/session", { method: "DELETE" }); } catch { /* signed out either way */ }
  showSignIn("Signed out.");
}

window.addEventListener("whet:signed-out", (e) => showSignIn(`Your session ended: ${e.detail}`));
window.addEventListener("hashchange", () => { if (me) route(); });
window.addEventListener("whet:reload", () => { if (me) route(); });

// The first page's data is asked for while the session is checked (one round trip instead of two
// before the page shows); a refused early answer is simply asked again by the page.
function prefetchFirstPage() {
  const { path, params } = parseHash();
  let m;
  if (path === "/jobs") prefetch(jobs.listPath(params));
  else if ((m = path.match(/^\/jobs\/([^/]+)$/)) && m[1] !== "new") prefetch(job.jobPath(decodeURIComponent(m[1])));
}

(async () => {
  try {
    if (csrfToken()) prefetchFirstPage();
    me = csrfToken() ? await api("/console/session") : null;
  } catch { me = null; }
  if (me) { showSignedIn(); route(); } else showSignIn();
})();

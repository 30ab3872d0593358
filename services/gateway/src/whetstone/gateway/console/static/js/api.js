// The public API, same origin, authenticated by the session cookie. State changes carry the session's
// CSRF token (from the `whet_csrf` cookie) in X-CSRF-Token. The API key itself is never kept here.

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || null;
    this.param = e.param || null;
  }
}

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === name) return decodeURIComponent(v.join("="));
  }
  return "";
}

export function csrfToken() {
  return cookie("whet_csrf");
}

function signedOut(err) {
  window.dispatchEvent(new CustomEvent("whet:signed-out", { detail: err.message }));
}

// GET answers asked for while the session check is still under way (the first page's data, see
// app.js): the page's own call for the same path takes the answer instead of asking again. Used once,
// and only while fresh; a failed early answer is asked again, as if never asked.
const early = new Map();   // path -> { at, answer }
const EARLY_FRESH_MS = 5000;

export function prefetch(path) {
  if (!early.has(path)) early.set(path, { at: performance.now(), answer: request(path, {}).catch((err) => err) });
}

export async function api(path, options = {}) {
  const held = early.get(path);
  if (held && (options.method || "GET") === "GET") {
    early.delete(path);
    const answer = await held.answer;
    if (!(answer instanceof Error) && performance.now() - held.at < EARLY_FRESH_MS) return answer;
  }
  try {
    return await request(path, options);
  } catch (err) {
    if (err instanceof ApiError && err.status === 401 && !path.startsWith("/console/session")) signedOut(err);
    throw err;
  }
}

async function request(path, { method = "GET", body, signal }) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (!["GET", "HEAD"].includes(method)) headers["X-CSRF-Token"] = csrfToken();
  const r = await fetch(path, { method, headers, signal, credentials: "same-origin",
                                body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 204) return null;
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

// A file upload with progress: XMLHttpRequest reports upload progress, fetch does not.
export function upload(file, purpose, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", "/v1/files");
    xhr.setRequestHeader("X-CSRF-Token", csrfToken());
    xhr.setRequestHeader("Accept", "application/json");
    xhr.upload.addEventListener("progress", (e) => onProgress(e.loaded, e.lengthComputable ? e.total : file.size));
    xhr.addEventListener("load", () => {
      let data = null;
      try { data = JSON.parse(xhr.responseText); } catch { data = null; }
      if (xhr.status >= 200 && xhr.status < 300) resolve(data);
      else {
        const err = new ApiError(xhr.status, data);
        if (xhr.status === 401) signedOut(err);
        reject(err);
      }
    });
    xhr.addEventListener("error", () => reject(new ApiError(0, { error: { message: "network error during upload" } })));
    const form = new FormData();
    form.append("purpose", purpose);
    form.append("file", file, file.name);
    xhr.send(form);
  });
}

// Server-sent events of one job (GET /v1/fine_tuning/jobs/{id}/events?stream=true), oldest first.
// The server pushes; the browser never polls. A dropped connection reopens after the last event seen.
export function jobEvents(jobId, onEvent, onDone) {
  let last = null, source = null, closed = false, retry = 1000;
  const open = () => {
    const url = `/v1/fine_tuning/jobs/${encodeURIComponent(jobId)}/events${query({ stream: "true", after: last })}`;
    source = new EventSource(url);
    source.onmessage = (m) => {
      retry = 1000;
      if (m.data === "[DONE]") { close(); onDone && onDone(); return; }
      let event;
      try { event = JSON.parse(m.data); } catch { return; }
      last = event.id;
      onEvent(event);
    };
    source.onerror = () => {
      source.close();
      if (!closed) { setTimeout(() => { if (!closed) open(); }, retry); retry = Math.min(retry * 2, 15000); }
    };
  };
  const close = () => { closed = true; if (source) source.close(); };
  open();
  return close;
}

// Building the page: every piece of data becomes a text node or an attribute value, never markup.
// (No innerHTML anywhere in the console: a job or file named `<script>` shows as those characters.)

const SVG_NS = "http://www.w3.org/2000/svg";

function safeUrl(value) {
  const url = String(value);
  return /^(#|\/(?!\/)|https?:\/\/)/i.test(url) ? url : "#";
}

function setProps(el, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.setAttribute("class", value);
    else if (key === "text") el.textContent = String(value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "value" || key === "checked" || key === "selected" || key === "disabled") el[key] = value;
    else if (key === "href" || key === "src") el.setAttribute(key, safeUrl(value));
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

export function append(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  return append(el, children);
}

export function svg(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setProps(el, props);
  return append(el, children);
}

export function clear(el) {
  el.replaceChildren();
  return el;
}

export function when(ts) {
  if (!ts) return "—";
  const d = new Date(ts * 1000);
  return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

export function bytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function num(n, digits = 4) {
  if (n === null || n === undefined || Number.isNaN(n)) return "—";
  return typeof n === "number" ? (Number.isInteger(n) ? n.toLocaleString("en") : n.toPrecision(digits)) : String(n);
}

export function table(headers, rows, opts = {}) {
  const numeric = new Set(opts.numeric || []);
  return h("table", opts.props || {},
    opts.caption ? h("caption", { class: "muted" }, opts.caption) : null,
    h("thead", {}, h("tr", {}, headers.map((t, i) => h("th", { scope: "col", class: numeric.has(i) ? "num" : null }, t)))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c, i) => h("td", { class: numeric.has(i) ? "num" : null }, c))))));
}

export function field(labelText, input, hint) {
  const id = input.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  input.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, labelText), input,
           hint ? h("div", { class: "muted", id: `${id}-hint` }, hint) : null);
}

export function statusBadge(status) {
  return h("span", { class: `status status-${String(status).replace(/[^a-z_]/g, "")}` }, status ?? "—");
}

export function notice(message, isError = false) {
  const el = document.getElementById("notice");
  el.className = isError ? "error" : "";
  el.textContent = message || "";
}

export function jsonBlock(value) {
  return h("pre", {}, JSON.stringify(value, null, 2));
}

// Building the page: plain DOM helpers and the formats numbers, bytes and times
// are shown in.

export const $ = selector => document.querySelector(selector);
export const enc = encodeURIComponent;

export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  node.append(...children.flat(Infinity).filter(c => c !== null && c !== undefined && c !== false));
  return node;
}

export function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  return node;
}

export const section = (title, ...children) => h("section", {}, h("h2", {}, title), ...children);
export const link = (text, ...parts) => h("a", {href: "#/" + parts.map(enc).join("/")}, text);
export const field = (label, input) => h("label", {}, h("span", {}, label), input);
export const options = (pairs, selected) => pairs.map(([value, label]) =>
  h("option", {value, selected: String(value) === String(selected)}, label ?? value));
export const jsonArea = (name, placeholder) => h("textarea", {name, placeholder});

export function details(pairs) {
  return h("dl", {class: "details"}, pairs.map(([label, value, name]) => [h("dt", {}, label),
    h("dd", {"data-field": name}, value instanceof Node ? value : String(value ?? "–"))]));
}

// -- formatting ---------------------------------------------------------------------
export const fmtNum = v => (v === undefined || v === null ? "–" : Number(v).toLocaleString("en"));
export const fmtRate = v => (v ?? 0).toFixed(1) + "/s";
export const rate = (stats, name) => (stats || {})[name + "_details"]?.rate ?? 0;
export const features = x => [x.durable && "D", x.auto_delete && "AD", x.exclusive && "Excl",
  x.internal && "I", Object.keys(x.arguments || {}).length && "Args"].filter(Boolean).join(" ");

export function fmtBytes(v) {
  if (typeof v !== "number") return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i ? v.toFixed(1) : v) + " " + units[i];
}

export function fmtDuration(ms) {
  const s = Math.floor((ms || 0) / 1000);
  const [d, hr, m] = [Math.floor(s / 86400), Math.floor(s / 3600) % 24, Math.floor(s / 60) % 60];
  return d ? `${d}d ${hr}h` : hr ? `${hr}h ${m}m` : m ? `${m}m ${s % 60}s` : `${s}s`;
}

export const fmtJSON = v => h("pre", {}, JSON.stringify(v ?? {}, null, 2));

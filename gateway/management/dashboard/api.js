// The management API and the session: who is signed in, with which credentials,
// and the settings the page keeps. It speaks RabbitMQ's management API, so the
// dashboard also works against RabbitMQ.
import {$, options} from "./dom.js";

export const state = {
  auth: sessionStorage.getItem("warren-auth") || "", user: null, vhosts: [], vhost: "",
  refreshMs: Number(localStorage.getItem("warren-refresh")) || 5000,
  chartMs: Number(localStorage.getItem("warren-chart-window")) || 60000,
  history: new Map(), seeded: new Set(), view: null, timer: 0, tickId: 0, pending: null,
};

export class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.reason || body.error)) || `HTTP ${status}`);
    this.status = status;
    this.problems = (body && body.problems) || [];
  }
}

export async function api(path, {method = "GET", body, headers = {}, auth = state.auth} = {}) {
  const sent = {Authorization: "Basic " + auth, "X-Requested-With": "XMLHttpRequest", ...headers};
  if (body !== undefined) sent["Content-Type"] = "application/json";
  let response;
  try {  // relative, so a path prefix in front of the API works too
    response = await fetch("api/" + path, {method, headers: sent,
      body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (error) {
    throw new ApiError(0, {reason: "cannot reach the broker (" + error.message + ")"});
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = {reason: text.slice(0, 200)}; }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const basic = (user, password) =>
  btoa(String.fromCharCode(...new TextEncoder().encode(user + ":" + password)));
// RabbitMQ before 3.9 sends tags as one comma-separated string
export const parseTags = tags => (Array.isArray(tags) ? tags : String(tags || "").split(","))
  .map(t => t.trim()).filter(Boolean);
export const isAdmin = () => state.user.tags.includes("administrator");
export const isPolicymaker = () =>
  state.user.tags.some(t => t === "policymaker" || t === "administrator");
export const isMonitor = () =>
  state.user.tags.some(t => t === "monitoring" || t === "administrator");
export const queueKey = (vhost, name) => vhost + "\n" + name;
export const inVhost = rows => (state.vhost ? rows.filter(r => r.vhost === state.vhost) : rows);

// -- session ------------------------------------------------------------------------------
// Signs in with `auth` (base64 of user:password) and shows the application; the
// caller then shows the page the address names.
export async function start(auth) {
  const me = await api("whoami", {auth});
  state.auth = auth;
  sessionStorage.setItem("warren-auth", auth);
  state.user = {name: me.name, tags: parseTags(me.tags)};
  $("#user-name").textContent = me.name +
    (state.user.tags.length ? ` (${state.user.tags.join(", ")})` : "");
  $("#login").hidden = true;
  for (const id of ["#app", "#session", "#tabs"]) $(id).hidden = false;
  showVhosts(await api("vhosts").catch(() => [{name: "/"}]));
}

// The vhosts the forms and the header's filter offer (the admin tab adds and deletes some).
export function showVhosts(vhosts) {
  const names = vhosts.map(v => v.name);
  if (names.join("\n") === state.vhosts.join("\n") && $("#vhost-filter").options.length) return;
  state.vhosts = names;
  if (!names.includes(state.vhost)) state.vhost = "";
  $("#vhost-filter").replaceChildren(...options([["", "All"], ...names.map(v => [v])],
                                                state.vhost));
}

export function signOut(message) {
  clearTimeout(state.timer);
  state.tickId++;
  Object.assign(state, {auth: "", user: null, view: null});
  state.history.clear();
  state.seeded.clear();
  sessionStorage.removeItem("warren-auth");
  $("#view").replaceChildren();
  for (const id of ["#app", "#session", "#tabs", "#alarms"]) $(id).hidden = true;
  $("#login").hidden = false;
  $("#password").value = "";
  $("#login-error").textContent = message || "";
  $("#password").focus();
}

export function loginMessage(error) {
  if (error.status === 401 && error.message === "Login failed")
    return "Login failed: wrong user name or password.";
  if (error.status === 401) return "Login refused: " + error.message;
  return "Cannot sign in: " + error.message;
}

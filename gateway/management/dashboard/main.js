// The management API's own single-page client: plain DOM and ES modules, no build
// step. Here: signing in, the header's settings, and routing the address
// (#/queues/{vhost}/{name}, ...) to a page.
import {flash} from "./actions.js";
import {adminView} from "./admin.js";
import {basic, loginMessage, signOut, start, state} from "./api.js";
import {channelsView, connectionsView, connectionView} from "./connections.js";
import {$, options} from "./dom.js";
import {exchangesView, exchangeView} from "./exchanges.js";
import {overviewView} from "./overview.js";
import {queuesView, queueView} from "./queues.js";
import {tick} from "./refresh.js";

// -- routing ----------------------------------------------------------------------------------
// A tab's list, or the page of one of its objects: #/queues/{vhost}/{name}, ...
const listOrPage = (list, page) => (...params) => (params.length ? page(...params) : list());
const VIEWS = {overview: overviewView, connections: listOrPage(connectionsView, connectionView),
  channels: channelsView, exchanges: listOrPage(exchangesView, exchangeView),
  queues: listOrPage(queuesView, queueView), admin: adminView};
const decoded = part => { try { return decodeURIComponent(part); } catch { return part; } };

function route() {
  if (!state.user) return;
  const [name, ...params] = location.hash.replace(/^#\/?/, "").split("/").map(decoded);
  const tab = VIEWS[name] ? name : "overview";
  state.view = VIEWS[tab](...params);
  $("#view").replaceChildren(state.view.el);
  for (const a of document.querySelectorAll("#tabs a"))
    a.classList.toggle("active", a.dataset.tab === tab);
  flash(state.pending?.[0], state.pending?.[1]);
  state.pending = null;
  tick();
}
window.addEventListener("hashchange", route);

// -- signing in and out -----------------------------------------------------------------------
$("#login").addEventListener("submit", async event => {
  event.preventDefault();
  const button = event.target.querySelector("button");
  $("#login-error").textContent = "";
  $("#login-status").textContent = "Signing in…";  // a refused login is answered late
  button.disabled = true;
  try {
    await start(basic($("#user").value, $("#password").value));
    route();
  } catch (error) {
    $("#login-error").textContent = loginMessage(error);
    $("#password").select();
  } finally {
    button.disabled = false;
    $("#login-status").textContent = "";
  }
});
$("#logout").addEventListener("click", () => signOut(""));

// -- header settings ----------------------------------------------------------------------------
$("#refresh").replaceChildren(...options([2, 5, 10, 30].map(s => [s * 1000, `every ${s} s`]),
                                         state.refreshMs));
$("#chart-window").replaceChildren(...options([[60000, "last minute"],
  [600000, "last 10 minutes"]], state.chartMs));
$("#refresh").addEventListener("change", event => {
  state.refreshMs = Number(event.target.value);
  localStorage.setItem("warren-refresh", state.refreshMs);
  tick();
});
$("#chart-window").addEventListener("change", event => {
  state.chartMs = Number(event.target.value);
  localStorage.setItem("warren-chart-window", state.chartMs);
  tick();
});
$("#vhost-filter").addEventListener("change", event => {
  state.vhost = event.target.value;
  tick();
});

if (state.auth) {
  start(state.auth).then(route).catch(error => signOut(error.status === 401 ?
    "Please sign in again." : "Cannot sign in: " + error.message));
} else {
  signOut("");
}

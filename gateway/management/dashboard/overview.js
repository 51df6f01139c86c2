// The overview: totals, the broker's charts, each node's memory and disk against
// their watermarks, and the listeners.
import {state} from "./api.js";
import {depthChart, rateChart} from "./charts.js";
import {details, fmtBytes, fmtDuration, fmtNum, h, section} from "./dom.js";
import {dataTable} from "./tables.js";

export function overviewView() {
  const cards = h("div", {class: "cards", id: "totals"});
  const depth = depthChart("overview-depth");
  const rates = rateChart("overview-rates", [["redeliver", "Redeliver"]]);
  const nodes = h("div", {id: "nodes"});
  const listeners = dataTable("listeners", [{label: "Protocol", value: l => l.protocol},
    {label: "Node", value: l => l.node}, {label: "Bound to", value: l => l.ip_address},
    {label: "Port", value: l => l.port, numeric: true}]);
  const el = h("div", {}, cards, section("Charts", h("div", {class: "charts"}, depth.el, rates.el)),
               section("Nodes", nodes), section("Listeners", listeners.el));
  function refresh({overview, nodes: list}) {
    const t = overview.object_totals || {}, q = overview.queue_totals || {};
    cards.replaceChildren(...[["Connections", t.connections], ["Channels", t.channels],
      ["Exchanges", t.exchanges], ["Queues", t.queues], ["Consumers", t.consumers],
      ["Ready", q.messages_ready], ["Unacked", q.messages_unacknowledged],
      ["Total", q.messages]].map(([label, v]) =>
        h("div", {class: "card", "data-card": label}, h("b", {}, fmtNum(v)), label)));
    const samples = state.history.get("overview") || [];
    depth.update(samples);
    rates.update(samples);
    nodes.replaceChildren(...(list.length ? list.map(nodeDetails) : [h("p", {class: "muted"},
      "Node details are shown to users tagged monitoring or administrator.")]));
    listeners.update(overview.listeners || []);
  }
  return {el, refresh};
}

function meter(fraction, alarm) {
  return h("div", {class: "meter" + (alarm ? " alarm" : "")},
           h("div", {style: `width:${Math.min(100, Math.max(0, fraction * 100)).toFixed(1)}%`}));
}

function nodeDetails(n) {
  if (n.mem_limit === undefined) {  // another node of the cluster: what this node knows of it
    return h("div", {"data-node": n.name}, h("h3", {}, n.name), details([
      ["Running", n.running ? "yes" : "no"],
      ...(n.running ? [["Uptime", fmtDuration(n.uptime)]] : []),
      ...(n.shards !== undefined ? [["Shards", fmtNum(n.shards)]] : [])]));
  }
  const alarmText = on => on ? h("span", {class: "alarm-text"}, "ALARM: publishers blocked")
    : h("span", {}, "no alarm");
  const memory = h("div", {}, h("h3", {}, "Memory"), meter(n.mem_used / n.mem_limit, n.mem_alarm),
    details([["Used", fmtBytes(n.mem_used), "mem_used"],
      ["High watermark", fmtBytes(n.mem_limit), "mem_limit"],
      ["Alarm", alarmText(n.mem_alarm), "mem_alarm"]]));
  const disk = h("div", {}, h("h3", {}, "Disk"),
    meter(n.disk_free ? n.disk_free_limit / n.disk_free : 1, n.disk_free_alarm),
    details([["Free", fmtBytes(n.disk_free), "disk_free"],
      ["Low watermark", fmtBytes(n.disk_free_limit), "disk_free_limit"],
      ["Alarm", alarmText(n.disk_free_alarm), "disk_free_alarm"]]));
  const failing = (n.failing_shards || []).map(s => `shard ${s.shard} (${s.restarts} restarts)`);
  const rest = details([["Running", n.running === false ? "no" : "yes"],
    ["Uptime", fmtDuration(n.uptime)],
    ["File descriptors", fmtNum(n.fd_used) + (n.fd_total ? " of " + fmtNum(n.fd_total) : "")],
    ["Processes", fmtNum(n.proc_used) + (n.proc_total ? " of " + fmtNum(n.proc_total) : "")],
    ["Processors", fmtNum(n.processors)],
    ...(n.shards !== undefined ? [["Shards", fmtNum(n.shards)],
      ["Failing shards", failing.join(", ") || "none"]] : [])]);
  return h("div", {"data-node": n.name}, h("h3", {}, n.name),
           h("div", {class: "node"}, memory, disk, rest));
}

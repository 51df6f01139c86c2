// The charts: sampled here, at each refresh, and kept as long as the page lives
// (the API's own rates are over its last few seconds only), drawn in SVG. What
// came before the page loaded, the broker's history gives (as RabbitMQ's does).
import {api, isMonitor, queueKey, state} from "./api.js";
import {enc, fmtNum, fmtRate, h, rate, svg} from "./dom.js";

const HISTORY_MS = 10 * 60 * 1000;
const MAX_SAMPLED_QUEUES = 1000;  // beyond, only the queue on screen keeps a history
const COLORS = ["#3a7bd5", "#e08a00", "#2e9e5b", "#b00020", "#7a4fd0"];

function record(key, t, values) {
  const samples = state.history.get(key) || [];
  samples.push({t, v: values});
  while (samples.length && samples[0].t < t - HISTORY_MS) samples.shift();
  state.history.set(key, samples);
}

// RabbitMQ's query for the history of lengths and message counters, 5 s apart.
const INCR = 5, HISTORY = `lengths_age=${HISTORY_MS / 1000}&lengths_incr=${INCR}` +
  `&msg_rates_age=${HISTORY_MS / 1000}&msg_rates_incr=${INCR}`;

// Chart points from an object's samples, oldest first: lengths as they were, rates
// as each counter's change since the sample before. The newest sample is the
// present, which the refresh records itself.
function pointsFrom(lengths, stats, names) {
  const samples = name => lengths?.[name + "_details"]?.samples ||
    stats?.[name + "_details"]?.samples;
  const ready = samples("messages_ready");
  if (!ready) return [];  // a broker that keeps no history
  const points = [];
  for (let i = ready.length - 2; i >= 1; i--) {
    const v = {};
    for (const [key, name] of names) {
      const s = samples(name);
      if (!s || !s[i] || !s[i + 1]) continue;
      v[key] = key === "ready" || key === "unacked" ? s[i].sample
        : Math.max(0, s[i].sample - s[i + 1].sample) / INCR;
    }
    points.push({t: ready[i].timestamp, v});
  }
  return points;
}
const SAMPLED = [["ready", "messages_ready"], ["unacked", "messages_unacknowledged"],
  ["publish", "publish"], ["deliver", "deliver_get"], ["ack", "ack"],
  ["redeliver", "redeliver"]];

// Points before the page's first for the overview and the queue on screen, once each.
async function history(overview) {
  const seeds = [];
  if (!state.seeded.has("overview")) {
    state.seeded.add("overview");
    seeds.push(["overview", pointsFrom(overview.queue_totals, overview.message_stats,
                                       SAMPLED)]);
  }
  const watch = state.view?.watch;
  if (watch && !state.seeded.has(watch.key)) {
    state.seeded.add(watch.key);
    const q = await api(`queues/${enc(watch.vhost)}/${enc(watch.name)}?${HISTORY}`)
      .catch(() => null);
    if (q) seeds.push([watch.key, pointsFrom(q, q.message_stats, SAMPLED)]);
  }
  for (const [key, points] of seeds) {
    const kept = state.history.get(key) || [];
    const first = kept[0]?.t ?? Date.now();
    state.history.set(key, [...points.filter(p => p.t < first && p.t > first - HISTORY_MS),
                            ...kept]);
  }
}

// One refresh's figures, which every page shares: {overview, queues, nodes}.
export async function sample() {
  const [overview, queues, nodes] = await Promise.all([
    api("overview" + (state.seeded.has("overview") ? "" : "?" + HISTORY)), api("queues"),
    isMonitor() ? api("nodes").catch(() => []) : []]);
  const t = Date.now(), totals = overview.queue_totals || {}, stats = overview.message_stats;
  record("overview", t, {ready: totals.messages_ready ?? 0,
    unacked: totals.messages_unacknowledged ?? 0, publish: rate(stats, "publish"),
    deliver: rate(stats, "deliver_get"), ack: rate(stats, "ack"),
    redeliver: rate(stats, "redeliver")});
  const seen = new Set(["overview"]);
  for (const q of queues) {
    const key = queueKey(q.vhost, q.name);
    if (queues.length > MAX_SAMPLED_QUEUES && key !== state.view?.watch?.key) continue;
    seen.add(key);
    record(key, t, {ready: q.messages_ready ?? 0, unacked: q.messages_unacknowledged ?? 0,
      publish: rate(q.message_stats, "publish"), deliver: rate(q.message_stats, "deliver_get"),
      ack: rate(q.message_stats, "ack")});
  }
  for (const key of state.history.keys()) if (!seen.has(key)) state.history.delete(key);
  await history(overview);
  return {overview, queues, nodes};
}

function niceCeiling(v) {
  if (!(v > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5, 10].find(m => m * power >= v) * power;
}

// A line chart of samples [{t, v: {key: value}}] over the chosen window, in SVG.
function lineChart(id, title, series, format) {
  const [W, H, L, R, T, B] = [640, 170, 56, 10, 8, 20];
  const plot = svg("svg", {viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title});
  const legend = h("div", {class: "legend"});
  const el = h("div", {class: "chart", id}, h("h3", {}, title), plot, legend);
  function update(samples) {
    const now = Date.now(), from = now - state.chartMs;
    const shown = samples.filter(s => s.t >= from);
    const top = niceCeiling(Math.max(0, ...shown.flatMap(s => series.map(([k]) => s.v[k] ?? 0))));
    const x = t => L + (t - from) / state.chartMs * (W - L - R);
    const y = v => T + (1 - v / top) * (H - T - B);
    const parts = [0, 0.5, 1].flatMap(f => [
      svg("line", {x1: L, x2: W - R, y1: y(top * f), y2: y(top * f), class: "grid"}),
      Object.assign(svg("text", {x: L - 6, y: y(top * f) + 4, "text-anchor": "end"}),
                    {textContent: format(top * f)})]);
    const label = (text, at, anchor) =>
      Object.assign(svg("text", {x: at, y: H - 4, "text-anchor": anchor}), {textContent: text});
    parts.push(label(`-${state.chartMs / 60000} min`, L, "start"), label("now", W - R, "end"));
    if (shown.length < 2) parts.push(Object.assign(svg("text", {x: W / 2, y: H / 2,
      "text-anchor": "middle"}), {textContent: "collecting samples…"}));
    series.forEach(([key], i) => parts.push(svg("polyline", {fill: "none",
      stroke: COLORS[i], "stroke-width": 2, "data-series": key,
      "data-values": shown.map(s => s.v[key] ?? 0).join(","),
      points: shown.map(s => `${x(s.t).toFixed(1)},${y(s.v[key] ?? 0).toFixed(1)}`).join(" ")})));
    plot.replaceChildren(...parts);
    const last = shown.at(-1)?.v || {};
    legend.replaceChildren(...series.map(([key, name], i) => h("span",
      {"data-series": key, "data-value": last[key] ?? 0},
      h("i", {style: `background:${COLORS[i]}`}), `${name}: ${format(last[key] ?? 0)}`)));
  }
  return {el, update};
}

export const depthChart = id => lineChart(id, "Queued messages",
  [["ready", "Ready"], ["unacked", "Unacked"]], fmtNum);
export const rateChart = (id, extra = []) => lineChart(id, "Message rates",
  [["publish", "Publish"], ["deliver", "Deliver / get"], ["ack", "Ack"], ...extra], fmtRate);

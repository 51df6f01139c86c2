// The connections and channels tabs, and a connection's page (its channels;
// closing it).
import {act, confirmed, go} from "./actions.js";
import {api, inVhost, state} from "./api.js";
import {details, enc, field, fmtBytes, fmtJSON, fmtNum, h, link, section} from "./dom.js";
import {dataTable} from "./tables.js";

const byteRate = v => (typeof v === "number" ? fmtBytes(v) + "/s" : "–");

const connectionColumns = () => [
  {label: "Name", value: c => c.name + (c.user_provided_name ? " " + c.user_provided_name : ""),
   render: c => [link(c.name, "connections", c.name), c.user_provided_name &&
     h("div", {class: "muted"}, c.user_provided_name)]},
  {label: "User", value: c => c.user}, {label: "Vhost", value: c => c.vhost},
  {label: "Client", value: c => [c.client_properties?.product, c.client_properties?.version]
    .filter(Boolean).join(" ")},
  {label: "Channels", value: c => c.channels, numeric: true},
  {label: "State", value: c => c.state}, {label: "TLS", value: c => (c.ssl ? "yes" : "no")},
  {label: "From client", value: c => c.recv_oct_details?.rate, numeric: true, format: byteRate},
  {label: "To client", value: c => c.send_oct_details?.rate, numeric: true, format: byteRate},
  {label: "Connected", value: c => c.connected_at,
   format: v => (v ? new Date(v).toLocaleString() : "–")}];

const channelColumns = () => [
  {label: "Channel", value: c => c.name,
   render: c => link(c.name, "connections", c.connection_details?.name ?? "")},
  {label: "User", value: c => c.user}, {label: "Vhost", value: c => c.vhost},
  {label: "Mode", value: c => [c.confirm && "confirm", c.transactional && "tx"]
    .filter(Boolean).join(" ")},
  {label: "Prefetch", value: c => c.prefetch_count, numeric: true},
  {label: "Unacked", value: c => c.messages_unacknowledged, numeric: true},
  {label: "Consumers", value: c => c.consumer_count, numeric: true},
  {label: "State", value: c => c.state}];

export function connectionsView() {
  const table = dataTable("connections", connectionColumns(), {empty: "No connections."});
  return {el: section("Connections", table.el),
          async refresh() { table.update(inVhost(await api("connections"))); }};
}

export function connectionView(name) {
  const info = h("div"), props = h("div");
  const channels = dataTable("connection-channels", channelColumns(), {empty: "No channels."});
  const reason = h("input", {name: "reason", value: "Closed via management plugin"});
  const close = h("form", {class: "box", async onsubmit(event) {
    event.preventDefault();
    if (!confirmed(`Close connection ${name}?`)) return;
    if (await act("Closing the connection", () => api("connections/" + enc(name),
        {method: "DELETE", headers: {"X-Reason": reason.value}})))
      go(`Connection ${name} closed.`, "connections");
  }}, field("Reason", reason), h("button", {class: "danger", id: "close-connection"}, "Close"));
  const el = h("div", {}, h("h2", {}, "Connection ", name), section("Details", info),
    section("Client properties", props), section("Channels", channels.el),
    section("Close this connection", close));
  async function refresh() {
    let conn;
    try {
      conn = await api("connections/" + enc(name));
    } catch (error) {
      if (error.status !== 404) throw error;
      info.replaceChildren(h("p", {class: "muted"}, "This connection is closed."));
      close.hidden = true;
      return channels.update([]);
    }
    info.replaceChildren(details([["User", conn.user], ["Vhost", conn.vhost],
      ["State", conn.state], ["Protocol", conn.protocol],
      ["Client", `${conn.peer_host}:${conn.peer_port}`], ["Server", `${conn.host}:${conn.port}`],
      ["TLS", conn.ssl ? "yes" : "no"], ["Authentication", conn.auth_mechanism],
      ["Heartbeat", conn.timeout + " s"], ["Frame max", fmtNum(conn.frame_max)],
      ["Channel max", fmtNum(conn.channel_max)], ["Channels", fmtNum(conn.channels)],
      ["Client-provided name", conn.user_provided_name || "none"],
      ["Received", fmtBytes(conn.recv_oct)], ["Sent", fmtBytes(conn.send_oct)],
      ["Connected", conn.connected_at ? new Date(conn.connected_at).toLocaleString() : "–"]]));
    props.replaceChildren(fmtJSON(conn.client_properties));
    const all = await api("channels");
    channels.update(all.filter(c => c.connection_details?.name === name));
  }
  return {el, refresh};
}

export function channelsView() {
  const table = dataTable("channels", channelColumns(), {empty: "No channels."});
  const consumers = dataTable("consumers", [
    {label: "Queue", value: c => c.queue.name, render: c => link(c.queue.name, "queues",
      c.queue.vhost, c.queue.name)},
    {label: "Vhost", value: c => c.queue.vhost}, {label: "Tag", value: c => c.consumer_tag},
    {label: "Channel", value: c => c.channel_details?.name},
    {label: "Ack", value: c => (c.ack_required ? "manual" : "auto")},
    {label: "Prefetch", value: c => c.prefetch_count, numeric: true},
    {label: "Status", value: c => c.activity_status ?? (c.active ? "up" : "")},
    {label: "Timeout (ms)", value: c => c.consumer_timeout, numeric: true}],
    {empty: "No consumers."});
  async function refresh() {
    const [list, found] = await Promise.all([api("channels"), api("consumers")]);
    table.update(inVhost(list));
    consumers.update(found.filter(c => !state.vhost || c.queue.vhost === state.vhost));
  }
  return {el: h("div", {}, section("Channels", table.el), section("Consumers", consumers.el)),
          refresh};
}

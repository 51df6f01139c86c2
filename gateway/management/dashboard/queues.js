// The queues tab (adding one) and a queue's page: its charts, consumers and
// bindings; binding, publishing, getting, purging and deleting.
import {act, confirmed, flash, go, parseObject} from "./actions.js";
import {api, inVhost, queueKey, state} from "./api.js";
import {depthChart, rateChart} from "./charts.js";
import {details, enc, features, field, fmtBytes, fmtJSON, fmtNum, fmtRate, h, jsonArea, link,
  options, rate, section} from "./dom.js";
import {bindingColumns, bindingForm, exchangeName, publishForm, vhostSelect, yesNo}
  from "./forms.js";
import {tick} from "./refresh.js";
import {dataTable} from "./tables.js";

export function queuesView() {
  const table = dataTable("queues", [{label: "Vhost", value: q => q.vhost},
    {label: "Name", value: q => q.name, render: q => link(q.name, "queues", q.vhost, q.name)},
    {label: "Type", value: q => q.type}, {label: "Features", value: features},
    {label: "State", value: q => q.state},
    {label: "Ready", value: q => q.messages_ready ?? 0, numeric: true, format: fmtNum},
    {label: "Unacked", value: q => q.messages_unacknowledged ?? 0, numeric: true, format: fmtNum},
    {label: "Total", value: q => q.messages ?? 0, numeric: true, format: fmtNum},
    {label: "Consumers", value: q => q.consumers ?? 0, numeric: true},
    {label: "Incoming", value: q => rate(q.message_stats, "publish"), numeric: true,
     format: fmtRate},
    {label: "Deliver / get", value: q => rate(q.message_stats, "deliver_get"), numeric: true,
     format: fmtRate},
    {label: "Ack", value: q => rate(q.message_stats, "ack"), numeric: true, format: fmtRate}],
    {sort: 1, empty: "No queues."});
  const form = h("form", {class: "box", id: "add-queue", async onsubmit(event) {
    event.preventDefault();
    const f = form.elements, name = f.name.value;
    if (await act("Adding the queue", async () => {
      const args = parseObject(f.arguments.value, "Arguments");
      if (f.type.value !== "classic") args["x-queue-type"] = f.type.value;
      await api(`queues/${enc(f.vhost.value)}/${enc(name)}`, {method: "PUT", body: {
        durable: f.durable.value === "true", auto_delete: f.auto_delete.value === "true",
        arguments: args}});
    })) { flash(`Queue ${name} added.`); form.reset(); tick(); }
  }}, field("Virtual host", vhostSelect()),
    field("Type", h("select", {name: "type"}, options([["classic", "Classic"],
      ["quorum", "Quorum"], ["stream", "Stream"]]))),
    field("Name", h("input", {name: "name", required: true})),
    field("Durable", yesNo("durable", true)), field("Auto delete", yesNo("auto_delete", false)),
    field("Arguments (JSON)", jsonArea("arguments", '{"x-max-length": 10000}')),
    h("button", {}, "Add queue"));
  return {el: h("div", {}, section("Queues", table.el), section("Add a new queue", form)),
          refresh({queues}) { table.update(inVhost(queues)); }};
}

export function queueView(vhost, name) {
  const path = `queues/${enc(vhost)}/${enc(name)}`;
  const depth = depthChart("queue-depth"), rates = rateChart("queue-rates");
  const info = h("div", {id: "queue-details"});
  const consumers = dataTable("queue-consumers", [{label: "Tag", value: c => c.consumer_tag},
    {label: "Channel", value: c => c.channel_details?.name,
     render: c => link(c.channel_details?.name ?? "", "connections",
                       c.channel_details?.connection_name ?? "")},
    {label: "Ack", value: c => (c.ack_required ? "manual" : "auto")},
    {label: "Prefetch", value: c => c.prefetch_count, numeric: true},
    {label: "Offset", value: c => c.stream_offset, numeric: true},
    {label: "Status", value: c => c.activity_status ?? ""}], {empty: "No consumers."});
  const bindings = dataTable("queue-bindings", bindingColumns(), {empty: "No bindings."});
  const messages = h("div", {id: "messages"});
  const get = h("form", {class: "box", id: "get-messages", async onsubmit(event) {
    event.preventDefault();
    const f = get.elements;
    let got = [];
    if (await act("Getting messages", async () => {
      got = await api(path + "/get", {method: "POST", body: {count: Number(f.count.value),
        ackmode: f.ackmode.value, encoding: f.encoding.value,
        truncate: Number(f.truncate.value) || undefined}});
    })) { showMessages(messages, got); tick(); }
  }}, field("Ack mode", h("select", {name: "ackmode"}, options([
      ["ack_requeue_true", "Nack message requeue true"],
      ["ack_requeue_false", "Automatic ack"], ["reject_requeue_true", "Reject requeue true"],
      ["reject_requeue_false", "Reject requeue false"]]))),
    field("Encoding", h("select", {name: "encoding"}, options([["auto",
      "Automatic string/base64"], ["base64", "Base64"]]))),
    field("Messages", h("input", {name: "count", type: "number", min: 1, value: 1})),
    field("Truncate at (bytes)", h("input", {name: "truncate", type: "number", value: 50000})),
    h("button", {}, "Get message(s)"));
  const purge = h("button", {class: "danger", id: "purge", async onclick() {
    if (confirmed(`Purge all ready messages of ${name}?`) &&
        await act("Purging", () => api(path + "/contents", {method: "DELETE"}))) {
      flash(`Queue ${name} purged.`);
      tick();
    }
  }}, "Purge messages");
  const remove = h("button", {class: "danger", id: "delete-queue", async onclick() {
    if (confirmed(`Delete queue ${name} and its messages?`) &&
        await act("Deleting the queue", () => api(path, {method: "DELETE"})))
      go(`Queue ${name} deleted.`, "queues");
  }}, "Delete queue");
  const el = h("div", {}, h("h2", {}, "Queue ", name, " in ", vhost),
    section("Charts", h("div", {class: "charts"}, depth.el, rates.el)), section("Details", info),
    section("Consumers", consumers.el), section("Bindings", bindings.el),
    section("Add binding to this queue", bindingForm(vhost, {kind: "q", destination: name})),
    section("Publish message", publishForm(vhost, "", name)),
    section("Get messages", get, messages), section("Purge", purge), section("Delete", remove));
  async function refresh({queues}) {
    const q = queues.find(x => x.vhost === vhost && x.name === name);
    if (!q) {
      info.replaceChildren(h("p", {class: "muted"}, "This queue does not exist (any more)."));
      return;
    }
    const samples = state.history.get(queueKey(vhost, name)) || [];
    depth.update(samples);
    rates.update(samples);
    info.replaceChildren(details([["Type", q.type], ["Features", features(q) || "none"],
      ["State", q.state], ["Policy", q.policy ?? "none"], ["Node", q.node],
      ["Ready", fmtNum(q.messages_ready ?? 0), "messages_ready"],
      ["Unacked", fmtNum(q.messages_unacknowledged ?? 0), "messages_unacknowledged"],
      ["Total", fmtNum(q.messages ?? 0), "messages"],
      ["Consumers", fmtNum(q.consumers ?? 0), "consumers"],
      ["Message bytes in memory", fmtBytes(q.message_bytes_ram)],
      ...(q.type === "stream" ? [["Segments", fmtNum(q.segments ?? 0), "segments"],
        ["Bytes on disk", fmtBytes(q.disk_bytes)]] : []),
      ["Arguments", fmtJSON(q.arguments)],
      ["Effective policy", fmtJSON(q.effective_policy_definition)]]));
    const [found, all] = await Promise.all([api("consumers/" + enc(vhost)),
                                            api("bindings/" + enc(vhost))]);
    consumers.update(found.filter(c => c.queue.name === name));
    bindings.update(all.filter(b => b.destination_type === "queue" && b.destination === name));
  }
  return {el, refresh, watch: {key: queueKey(vhost, name), vhost, name}};
}

function showMessages(box, got) {
  if (!got.length) return box.replaceChildren(h("p", {class: "muted"}, "Queue is empty."));
  box.replaceChildren(...got.map((m, i) => h("div", {class: "message"},
    h("h3", {}, `Message ${i + 1}`, ` (${m.message_count} left in the queue)`),
    details([["Exchange", exchangeName(m.exchange)], ["Routing key", m.routing_key],
      ["Redelivered", m.redelivered ? "yes" : "no"], ["Properties", fmtJSON(m.properties)],
      ["Payload", `${fmtNum(m.payload_bytes)} bytes, encoding ${m.payload_encoding}`]]),
    h("pre", {class: "payload"}, m.payload))));
}

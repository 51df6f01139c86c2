// The exchanges tab (adding one) and an exchange's page (its bindings; binding,
// publishing, deleting).
import {act, confirmed, flash, go, parseObject} from "./actions.js";
import {api, inVhost} from "./api.js";
import {details, enc, features, field, fmtJSON, h, jsonArea, link, options, section}
  from "./dom.js";
import {bindingColumns, bindingForm, DEFAULT, exchangeName, publishForm, vhostSelect, yesNo}
  from "./forms.js";
import {tick} from "./refresh.js";
import {dataTable} from "./tables.js";

export function exchangesView() {
  const table = dataTable("exchanges", [{label: "Vhost", value: x => x.vhost},
    {label: "Name", value: x => exchangeName(x.name),
     render: x => link(exchangeName(x.name), "exchanges", x.vhost, x.name || DEFAULT)},
    {label: "Type", value: x => x.type}, {label: "Features", value: features},
    {label: "Policy", value: x => x.policy ?? ""}], {sort: 1});
  const form = h("form", {class: "box", id: "add-exchange", async onsubmit(event) {
    event.preventDefault();
    const f = form.elements, name = f.name.value;
    if (await act("Adding the exchange", async () => {
      await api(`exchanges/${enc(f.vhost.value)}/${enc(name)}`, {method: "PUT", body: {
        type: f.type.value, durable: f.durable.value === "true",
        auto_delete: f.auto_delete.value === "true", internal: f.internal.value === "true",
        arguments: parseObject(f.arguments.value, "Arguments")}});
    })) { flash(`Exchange ${name} added.`); form.reset(); tick(); }
  }}, field("Virtual host", vhostSelect()),
    field("Name", h("input", {name: "name", required: true})),
    field("Type", h("select", {name: "type"}, options(["direct", "fanout", "topic", "headers"]
      .map(t => [t])))), field("Durable", yesNo("durable", true)),
    field("Auto delete", yesNo("auto_delete", false)), field("Internal", yesNo("internal", false)),
    field("Arguments (JSON)", jsonArea("arguments", '{"alternate-exchange": "unrouted"}')),
    h("button", {}, "Add exchange"));
  return {el: h("div", {}, section("Exchanges", table.el), section("Add a new exchange", form)),
          async refresh() { table.update(inVhost(await api("exchanges"))); }};
}

export function exchangeView(vhost, routed) {
  const name = routed === DEFAULT ? "" : routed;
  const info = h("div");
  const bindings = dataTable("exchange-bindings", bindingColumns(), {empty: "No bindings."});
  const removable = name !== "" && !name.startsWith("amq.");
  const remove = h("button", {class: "danger", id: "delete-exchange", async onclick() {
    if (confirmed(`Delete exchange ${name}?`) && await act("Deleting the exchange",
        () => api(`exchanges/${enc(vhost)}/${enc(name)}`, {method: "DELETE"})))
      go(`Exchange ${name} deleted.`, "exchanges");
  }}, "Delete this exchange");
  const el = h("div", {}, h("h2", {}, "Exchange ", exchangeName(name), " in ", vhost),
    section("Details", info), section("Bindings", bindings.el),
    name ? section("Add binding from this exchange", bindingForm(vhost, {source: name})) : null,
    section("Publish message", publishForm(vhost, name)),
    removable ? section("Delete", remove) : null);
  async function refresh() {
    // the default exchange from the list: not every broker answers GET .../amq.default
    const [x, all] = await Promise.all([(name ? api(`exchanges/${enc(vhost)}/${enc(name)}`)
      : api("exchanges/" + enc(vhost)).then(list => list.find(e => e.name === "")))
      .catch(error => { if (error.status !== 404) throw error; }), api("bindings/" + enc(vhost))]);
    if (!x) return info.replaceChildren(h("p", {class: "muted"}, "This exchange does not exist."));
    info.replaceChildren(details([["Type", x.type], ["Features", features(x) || "none"],
      ["Policy", x.policy ?? "none"], ["Arguments", fmtJSON(x.arguments)]]));
    bindings.update(all.filter(b => b.source === name ||
      (b.destination_type === "exchange" && b.destination === name)));
  }
  return {el, refresh};
}

// What the exchange and queue pages share: the bindings table, the binding and
// publishing forms, and their small inputs.
import {act, flash, parseObject} from "./actions.js";
import {api, state} from "./api.js";
import {enc, field, h, jsonArea, link, options} from "./dom.js";
import {tick} from "./refresh.js";

export const vhostSelect = () => h("select", {name: "vhost"},
  options(state.vhosts.map(v => [v]), state.vhost || "/"));
export const yesNo = (name, yes) => h("select", {name},
  options([["true", "Yes"], ["false", "No"]], String(yes)));
export const exchangeName = name => name || "(AMQP default)";
export const DEFAULT = "amq.default";  // RabbitMQ's name for the default exchange in paths

export const bindingColumns = () => [
  {label: "From", value: b => exchangeName(b.source),
   render: b => link(exchangeName(b.source), "exchanges", b.vhost, b.source || DEFAULT)},
  {label: "To", value: b => b.destination, render: b => link(b.destination,
    b.destination_type === "queue" ? "queues" : "exchanges", b.vhost, b.destination)},
  {label: "Type", value: b => b.destination_type},
  {label: "Routing key", value: b => b.routing_key},
  {label: "Arguments", value: b => JSON.stringify(b.arguments || {})}];

// POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}
export function bindingForm(vhost, fixed) {
  const form = h("form", {class: "box", id: "add-binding", async onsubmit(event) {
    event.preventDefault();
    const f = form.elements;
    const source = fixed.source ?? f.source.value;
    const kind = fixed.kind ?? f.kind.value, destination = fixed.destination ?? f.destination.value;
    if (await act("Binding", () => api(`bindings/${enc(vhost)}/e/${enc(source)}/${kind}/` +
        enc(destination), {method: "POST", body: {routing_key: f.routing_key.value,
          arguments: parseObject(f.arguments.value, "Arguments")}}))) {
      flash(`Bound ${source} to ${destination}.`);
      form.reset();
      tick();
    }
  }}, fixed.source === undefined ? field("From exchange", h("input", {name: "source",
    required: true})) : null,
    fixed.kind === undefined ? field("To", h("select", {name: "kind"},
      options([["q", "Queue"], ["e", "Exchange"]]))) : null,
    fixed.destination === undefined ? field("Destination", h("input", {name: "destination",
      required: true})) : null,
    field("Routing key", h("input", {name: "routing_key"})),
    field("Arguments (JSON)", jsonArea("arguments", '{"x-match": "all"}')),
    h("button", {}, "Bind"));
  return form;
}

// POST /api/exchanges/{vhost}/{exchange}/publish; RabbitMQ names the default one amq.default.
export function publishForm(vhost, exchange, routingKey) {
  const form = h("form", {class: "box", id: "publish", async onsubmit(event) {
    event.preventDefault();
    const f = form.elements;
    let routed;
    const ok = await act("Publishing", async () => {
      const headers = parseObject(f.headers.value, "Headers");
      const properties = {...parseObject(f.properties.value, "Properties"),
        delivery_mode: Number(f.delivery_mode.value)};
      if (Object.keys(headers).length) properties.headers = headers;
      ({routed} = await api(`exchanges/${enc(vhost)}/${enc(exchange || DEFAULT)}/publish`,
        {method: "POST", body: {properties, payload: f.payload.value,
          routing_key: routingKey ?? f.routing_key.value, payload_encoding: f.encoding.value}}));
    });
    if (ok) {
      flash(routed ? "Message published." : "Message published, but not routed.",
            routed ? "ok" : "error");
      tick();
    }
  }}, routingKey === undefined ? field("Routing key", h("input", {name: "routing_key"})) : null,
    field("Delivery mode", h("select", {name: "delivery_mode"},
      options([["1", "1 - Non-persistent"], ["2", "2 - Persistent"]]))),
    field("Headers (JSON)", jsonArea("headers", '{"origin": "dashboard"}')),
    field("Properties (JSON)", jsonArea("properties", '{"content_type": "text/plain"}')),
    field("Payload", h("textarea", {name: "payload"})),
    field("Payload encoding", h("select", {name: "encoding"},
      options([["string", "String"], ["base64", "Base64"]]))),
    h("button", {}, "Publish message"));
  return form;
}

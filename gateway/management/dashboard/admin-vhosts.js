// The admin tab's virtual hosts and their limits (administrators), and policies
// (administrators and policymakers), with the calls RabbitMQ's management UI makes.
import {parseObject} from "./actions.js";
import {enc, h, options, section} from "./dom.js";
import {adminTable, choices, limitRows, putForm} from "./editor.js";

const VHOST_LIMITS = ["max-connections", "max-queues"];
const APPLY_TO = [["all", "Exchanges and queues"], ["queues", "Queues"],
  ["exchanges", "Exchanges"], ["classic_queues", "Classic queues"],
  ["quorum_queues", "Quorum queues"], ["streams", "Streams"]];

export function vhostsAdmin() {
  let known = new Set();
  const vhosts = adminTable("admin-vhosts", [{label: "Name", value: v => v.name},
    {label: "Description", value: v => v.description ?? ""}],
    {remove: v => [`vhosts/${enc(v.name)}`, `virtual host ${v.name}`],
     empty: "No virtual hosts.",
     edit: v => [addVhost, {name: v.name, description: v.description}]});
  const addVhost = putForm("add-vhost", [["Name", h("input", {name: "name", required: true})],
    ["Description", h("input", {name: "description"})]], "Add or update virtual host",
    f => [`vhosts/${enc(f.name.value)}`, {description: f.description.value},
      `Virtual host ${f.name.value} ${known.has(f.name.value) ? "updated" : "added"}.`]);

  const limits = adminTable("admin-vhost-limits", [{label: "Virtual host", value: l => l.owner},
    {label: "Limit", value: l => l.name}, {label: "Value", value: l => l.value, numeric: true}],
    {remove: l => [`vhost-limits/${enc(l.owner)}/${enc(l.name)}`,
                   `limit ${l.name} of ${l.owner}`], empty: "No virtual host limits.",
     edit: l => [setLimit, {vhost: l.owner, limit: l.name, value: l.value}]});
  const limitVhost = choices("vhost"), limitName = choices("limit", VHOST_LIMITS);
  limitName.update([]);
  const setLimit = putForm("set-vhost-limit", [["Virtual host", limitVhost.el],
    ["Limit", limitName.el], ["Value", h("input", {name: "value", type: "number",
                                                   required: true})]], "Set virtual host limit",
    f => [`vhost-limits/${enc(f.vhost.value)}/${enc(f.limit.value)}`,
      {value: Number(f.value.value)}, `Limit ${f.limit.value} of ${f.vhost.value} set.`]);

  const el = [section("Virtual hosts", vhosts.el, h("h3", {}, "Add a virtual host"), addVhost),
    section("Virtual host limits", limits.el, h("h3", {}, "Set a virtual host limit"), setLimit)];
  return {el, update({vhosts: list, vhostLimits}) {
    known = new Set(list.map(v => v.name));
    vhosts.update(list);
    limits.update(limitRows(vhostLimits, "vhost"));
    limitVhost.update(list.map(v => v.name));
  }};
}

export function policiesAdmin() {
  const policies = adminTable("admin-policies", [{label: "Virtual host", value: p => p.vhost},
    {label: "Name", value: p => p.name}, {label: "Pattern", value: p => p.pattern},
    {label: "Apply to", value: p => p["apply-to"]},
    {label: "Definition", value: p => JSON.stringify(p.definition || {})},
    {label: "Priority", value: p => p.priority, numeric: true}],
    {remove: p => [`policies/${enc(p.vhost)}/${enc(p.name)}`, `policy ${p.name} in ${p.vhost}`],
     empty: "No policies.",
     edit: p => [addPolicy, {vhost: p.vhost, name: p.name, pattern: p.pattern,
                             apply_to: p["apply-to"], priority: p.priority,
                             definition: JSON.stringify(p.definition || {})}]});
  const policyVhost = choices("vhost");
  const addPolicy = putForm("add-policy", [["Virtual host", policyVhost.el],
    ["Name", h("input", {name: "name", required: true})],
    ["Pattern", h("input", {name: "pattern", required: true, placeholder: "^orders\\."})],
    ["Apply to", h("select", {name: "apply_to"}, options(APPLY_TO))],
    ["Priority", h("input", {name: "priority", type: "number", value: 0})],
    ["Definition (JSON)", h("textarea", {name: "definition", required: true,
                                         placeholder: '{"max-length": 1000}'})]],
    "Add or update policy", f => [`policies/${enc(f.vhost.value)}/${enc(f.name.value)}`,
      {pattern: f.pattern.value, "apply-to": f.apply_to.value,
       priority: Number(f.priority.value) || 0,
       definition: parseObject(f.definition.value, "Definition")},
      `Policy ${f.name.value} set in ${f.vhost.value}.`]);

  const el = [section("Policies", policies.el, h("h3", {}, "Add or update a policy"),
                      addPolicy)];
  return {el, update({vhosts: list, policies: set}) {
    policies.update(set);
    policyVhost.update(list.map(v => v.name));
  }};
}

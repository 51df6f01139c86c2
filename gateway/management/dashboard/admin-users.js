// The admin tab's users, their permissions and their limits, with the calls
// RabbitMQ's management UI makes.
import {parseTags} from "./api.js";
import {enc, h, section} from "./dom.js";
import {adminTable, choices, limitRows, putForm} from "./editor.js";

const USER_LIMITS = ["max-connections", "max-channels"];

export function usersAdmin() {
  let known = new Map();
  const users = adminTable("admin-users", [{label: "Name", value: u => u.name},
    {label: "Tags", value: u => parseTags(u.tags).join(", ")},
    {label: "Password", value: u => (u.password_hash ? "yes" : "no")}],
    {remove: u => [`users/${enc(u.name)}`, `user ${u.name}`], empty: "No users.",
     edit: u => [addUser, {name: u.name, password: "", tags: parseTags(u.tags).join(", ")}]});
  const addUser = putForm("add-user", [["Name", h("input", {name: "name", required: true})],
    ["Password", h("input", {name: "password", type: "password", autocomplete: "new-password",
                             placeholder: "unchanged when updating a user"})],
    ["Tags", h("input", {name: "tags",
                         placeholder: "administrator, monitoring, policymaker, management"})]],
    "Add or update user", f => {
      const name = f.name.value, old = known.get(name), body = {tags: f.tags.value};
      if (f.password.value) body.password = f.password.value;
      // a PUT without a password would leave the user none: keep the one it has
      else if (old) Object.assign(body, {password_hash: old.password_hash,
                                         hashing_algorithm: old.hashing_algorithm});
      else throw new Error("a new user needs a password");
      return [`users/${enc(name)}`, body, `User ${name} ${old ? "updated" : "added"}.`];
    });

  const permissions = adminTable("admin-permissions", [{label: "User", value: p => p.user},
    {label: "Virtual host", value: p => p.vhost}, {label: "Configure", value: p => p.configure},
    {label: "Write", value: p => p.write}, {label: "Read", value: p => p.read}],
    {remove: p => [`permissions/${enc(p.vhost)}/${enc(p.user)}`,
                   `permissions of ${p.user} in ${p.vhost}`], empty: "No permissions.",
     edit: p => [setPermission, {user: p.user, vhost: p.vhost, configure: p.configure,
                                 write: p.write, read: p.read}]});
  const permUser = choices("user"), permVhost = choices("vhost");
  const regexp = name => h("input", {name, value: ".*"});
  const setPermission = putForm("set-permission", [["User", permUser.el],
    ["Virtual host", permVhost.el], ["Configure regexp", regexp("configure")],
    ["Write regexp", regexp("write")], ["Read regexp", regexp("read")]], "Set permission",
    f => [`permissions/${enc(f.vhost.value)}/${enc(f.user.value)}`, {configure: f.configure.value,
      write: f.write.value, read: f.read.value},
      `Permissions of ${f.user.value} in ${f.vhost.value} set.`]);

  const limits = adminTable("admin-user-limits", [{label: "User", value: l => l.owner},
    {label: "Limit", value: l => l.name}, {label: "Value", value: l => l.value, numeric: true}],
    {remove: l => [`user-limits/${enc(l.owner)}/${enc(l.name)}`, `limit ${l.name} of ${l.owner}`],
     empty: "No user limits.",
     edit: l => [setLimit, {user: l.owner, limit: l.name, value: l.value}]});
  const limitUser = choices("user"), limitName = choices("limit", USER_LIMITS);
  limitName.update([]);
  const setLimit = putForm("set-user-limit", [["User", limitUser.el], ["Limit", limitName.el],
    ["Value", h("input", {name: "value", type: "number", required: true})]], "Set user limit",
    f => [`user-limits/${enc(f.user.value)}/${enc(f.limit.value)}`,
      {value: Number(f.value.value)}, `Limit ${f.limit.value} of ${f.user.value} set.`]);

  const el = [section("Users", users.el, h("h3", {}, "Add or update a user"), addUser),
    section("Permissions", permissions.el, h("h3", {}, "Set permissions"), setPermission),
    section("User limits", limits.el, h("h3", {}, "Set a user limit"), setLimit)];
  return {el, update({users: list, vhosts, permissions: granted, userLimits}) {
    known = new Map(list.map(u => [u.name, u]));
    const names = list.map(u => u.name);
    users.update(list);
    permissions.update(granted);
    limits.update(limitRows(userLimits, "user"));
    for (const select of [permUser, limitUser]) select.update(names);
    permVhost.update(vhosts.map(v => v.name));
  }};
}

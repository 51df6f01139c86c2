// The admin tab: who is signed in; users, virtual hosts, permissions, policies and
// limits (policies for policymakers too, the rest for administrators, as in
// RabbitMQ); exporting and importing definitions.
import {act, flash} from "./actions.js";
import {usersAdmin} from "./admin-users.js";
import {policiesAdmin, vhostsAdmin} from "./admin-vhosts.js";
import {api, isAdmin, isPolicymaker, showVhosts, state} from "./api.js";
import {details, field, h, section} from "./dom.js";

export function adminView() {
  const who = h("div");
  const file = h("input", {type: "file", name: "file", accept: ".json,application/json",
                           required: true});
  const upload = h("form", {class: "box", id: "import", async onsubmit(event) {
    event.preventDefault();
    if (await act("Importing definitions", async () => {
      let definitions;
      try { definitions = JSON.parse(await file.files[0].text()); } catch {
        throw new Error(`${file.files[0].name} is not a JSON file`);
      }
      await api("definitions", {method: "POST", body: definitions});
    })) { flash(`Definitions imported from ${file.files[0].name}.`); upload.reset(); }
  }}, field("Definitions file", file), h("button", {}, "Upload definitions"));
  const download = h("button", {id: "export", type: "button", async onclick() {
    let definitions;
    if (!await act("Exporting definitions",
                   async () => { definitions = await api("definitions"); }))
      return;
    const blob = new Blob([JSON.stringify(definitions, null, 2)], {type: "application/json"});
    const a = h("a", {href: URL.createObjectURL(blob),
      download: `definitions-${location.hostname}-${new Date().toISOString().slice(0, 10)}.json`});
    document.body.append(a);
    a.click();
    a.remove();
    const n = key => (definitions[key] || []).length;
    flash(`Definitions exported: ${n("queues")} queues, ${n("exchanges")} exchanges, ` +
          `${n("bindings")} bindings, ${n("users")} users, ${n("vhosts")} vhosts.`);
  }}, "Download broker definitions");
  const users = usersAdmin(), vhosts = vhostsAdmin(), policies = policiesAdmin();
  const managed = h("div", {id: "managed"});
  const el = h("div", {}, section("Signed in", who), managed, section("Export definitions",
    h("p", {class: "muted"}, "Users, vhosts, permissions, policies, queues, exchanges and " +
      "bindings, in RabbitMQ's definitions format (administrators only)."), download),
    section("Import definitions", upload));
  return {el, async refresh() {
    who.replaceChildren(details([["User", state.user.name],
      ["Tags", state.user.tags.join(", ") || "none"]]));
    const notice = section("Users and virtual hosts", h("p", {class: "muted"},
      "Users, virtual hosts, permissions and limits are managed by administrators."));
    if (!isAdmin() && !isPolicymaker()) {
      managed.replaceChildren(notice);
      return;
    }
    const wanted = isAdmin() ? ["vhosts", "policies", "users", "permissions", "vhost-limits",
                                "user-limits"] : ["vhosts", "policies"];
    const [vhostList, policyList, userList, permissions, vhostLimits, userLimits] =
      await Promise.all(wanted.map(path => api(path)));
    const lists = {vhosts: vhostList, policies: policyList, users: userList, permissions,
                   vhostLimits, userLimits};
    policies.update(lists);
    if (isAdmin()) {
      users.update(lists);
      vhosts.update(lists);
      showVhosts(vhostList);
    }
    if (!managed.children.length)
      managed.replaceChildren(...(isAdmin() ? [...users.el, ...vhosts.el] : [notice]),
                              ...policies.el);
  }};
}

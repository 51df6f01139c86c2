// What the admin tab's lists share: a table whose rows each have an edit and a
// delete button, a form that adds or updates an item with a PUT, and selects of
// users or vhosts that keep their choice as the lists change.
import {act, confirmed, flash} from "./actions.js";
import {api} from "./api.js";
import {field, h, options} from "./dom.js";
import {tick} from "./refresh.js";
import {dataTable} from "./tables.js";

// columns as dataTable's; remove(row) -> [API path, what the row is]; edit(row) ->
// [the form that updates it, {field: value}], which its Edit button fills in.
export function adminTable(id, columns, {remove, edit, empty}) {
  return dataTable(id, [...columns, {label: "", value: () => "", render(row) {
    const [path, what] = remove(row);
    return h("span", {class: "row-actions"}, h("button", {type: "button",
      "aria-label": `Edit ${what}`, onclick() {
        const [form, values] = edit(row);
        for (const [name, value] of Object.entries(values))
          form.elements[name].value = String(value ?? "");
        form.scrollIntoView({block: "center"});
        form.elements[0].focus();
      }}, "Edit"), " ", h("button", {type: "button", class: "danger",
      "aria-label": `Delete ${what}`, async onclick() {
        if (confirmed(`Delete ${what}?`) &&
            await act(`Deleting ${what}`, () => api(path, {method: "DELETE"}))) {
          flash(`Deleted ${what}.`);
          tick();
        }
      }}, "Delete"));
  }}], {empty});
}

// A form of [label, input] pairs; put(its elements) -> [API path, body, what to say after].
export function putForm(id, fields, button, put) {
  const form = h("form", {class: "box", id, async onsubmit(event) {
    event.preventDefault();
    let said;
    if (await act(button, async () => {
      const [path, body, message] = put(form.elements);
      said = message;
      await api(path, {method: "PUT", body});
    })) { flash(said); form.reset(); tick(); }
  }}, fields.map(([label, input]) => field(label, input)), h("button", {}, button));
  return form;
}

export function choices(name, fixed = []) {
  const el = h("select", {name, required: true});
  let shown = null;
  return {el, update(values) {
    const next = [...fixed, ...values];
    if (shown && next.join("\n") === shown.join("\n")) return;  // an open list stays open
    shown = next;
    el.replaceChildren(...options(next.map(v => [v]), el.value));
  }};
}

// Rows of [{<owner>: name, value: {limit: n}}], one per limit.
export const limitRows = (list, owner) => list.flatMap(l =>
  Object.entries(l.value || {}).map(([name, value]) => ({owner: l[owner], name, value})));

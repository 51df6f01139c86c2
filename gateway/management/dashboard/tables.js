// Tables sorted by a click on a column's head and filtered by text or a regular
// expression; each keeps its filter and order as the user moves between pages.
import {h} from "./dom.js";

const tableSettings = new Map();

function compare(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), "en", {numeric: true});
}

// columns: {label, value(row), numeric, format(value), render(row) -> Node}
export function dataTable(id, columns, {empty = "Nothing here.", sort = 0} = {}) {
  const saved = tableSettings.get(id) || {filter: "", regex: false, sort, descending: false};
  tableSettings.set(id, saved);
  let rows = [];
  const filter = h("input", {type: "search", placeholder: "Filter", class: "filter",
                             "aria-label": "Filter", value: saved.filter});
  const regex = h("input", {type: "checkbox", checked: saved.regex});
  const count = h("span", {class: "muted count"}), body = h("tbody");
  const head = h("tr", {}, columns.map((column, index) => h("th", {
    class: column.numeric ? "n sortable" : "sortable", onclick() {
      saved.descending = saved.sort === index ? !saved.descending : !!column.numeric;
      saved.sort = index;
      render();
    }}, column.label)));
  const value = (column, row) => column.value(row) ?? "";
  function matcher() {
    const text = filter.value.trim();
    filter.classList.remove("invalid");
    if (!text) return () => true;
    if (!regex.checked) return s => s.toLowerCase().includes(text.toLowerCase());
    try {
      const re = new RegExp(text, "i");
      return s => re.test(s);
    } catch {
      filter.classList.add("invalid");
      return () => true;
    }
  }
  function render() {
    const matches = matcher(), column = columns[saved.sort], sign = saved.descending ? -1 : 1;
    const shown = rows.filter(row => columns.some(c => matches(String(value(c, row)))));
    shown.sort((a, b) => compare(value(column, a), value(column, b)) * sign);
    head.querySelectorAll("th").forEach((th, i) => {
      th.dataset.sort = i === saved.sort ? (saved.descending ? "desc" : "asc") : "";
    });
    body.replaceChildren(...(shown.length ? shown.map(row => h("tr", {}, columns.map(c =>
      h("td", {class: c.numeric ? "n" : null},
        c.render ? c.render(row) : (c.format || String)(value(c, row))))))
      : [h("tr", {}, h("td", {colspan: columns.length, class: "muted"},
                       rows.length ? "No item matches the filter." : empty))]));
    const items = `${rows.length} item${rows.length === 1 ? "" : "s"}`;
    count.textContent = shown.length === rows.length ? items : `${shown.length} of ${items}`;
  }
  filter.addEventListener("input", () => { saved.filter = filter.value; render(); });
  regex.addEventListener("change", () => { saved.regex = regex.checked; render(); });
  const el = h("div", {class: "table"}, h("div", {class: "toolbar"}, filter,
    h("label", {}, regex, " regex"), count), h("table", {id}, h("thead", {}, head), body));
  return {el, update(next) { rows = next; render(); }};
}

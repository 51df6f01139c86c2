// What the forms and buttons share: running an action, saying how it went, and
// moving to another page after it.
import {state} from "./api.js";
import {$, enc} from "./dom.js";

export function flash(message, kind = "ok") {
  const box = $("#flash");
  box.hidden = !message;
  box.className = box.dataset.kind = kind;
  box.textContent = message || "";
}

// Runs an action, flashing what went wrong; true when it worked.
export async function act(label, action) {
  try {
    await action();
    return true;
  } catch (error) {
    const problems = (error.problems || []).map(p => "\n• " + p).join("");
    flash(`${label} failed: ${error.message}` + (error.status ? ` (HTTP ${error.status})` : "") +
          problems, "error");
    return false;
  }
}

export function parseObject(text, what) {
  if (!text.trim()) return {};
  let value;
  try { value = JSON.parse(text); } catch { value = null; }
  if (!value || typeof value !== "object" || Array.isArray(value))
    throw new Error(`${what} must be a JSON object, such as {"x-max-length": 1000}`);
  return value;
}

export const confirmed = question => window.confirm(question);

// Shows the page #/parts..., flashing `message` there (the router shows it).
export function go(message, ...parts) {
  state.pending = [message, "ok"];
  location.hash = "#/" + parts.map(enc).join("/");
}

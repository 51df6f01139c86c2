// The refresh loop: every few seconds one sample of the broker's figures, the
// header's alarms, then the page on screen redrawn from them.
import {api, signOut, state} from "./api.js";
import {sample} from "./charts.js";
import {$, fmtBytes, h} from "./dom.js";

export async function tick() {
  const id = ++state.tickId, view = state.view;
  clearTimeout(state.timer);
  if (!view) return;
  try {
    const shared = await sample();
    showHeader(shared);
    if (id !== state.tickId) return;
    await view.refresh(shared);
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (error) {
    // 401 also means "not allowed to see that": sign out only when the login itself fails
    if (error.status === 401 && id === state.tickId &&
        await api("whoami").then(() => false, e => e.status === 401))
      return signOut("Signed out: " + error.message);
    $("#updated").textContent = "refresh failed: " + error.message;
  } finally {
    if (id === state.tickId && state.user) state.timer = setTimeout(tick, state.refreshMs);
  }
}

function showHeader({overview, nodes}) {
  const alarms = [];
  for (const n of nodes) {
    if (n.mem_alarm) alarms.push(`Memory alarm on ${n.name}: ${fmtBytes(n.mem_used)} used, ` +
      `limit ${fmtBytes(n.mem_limit)}. Publishers are blocked.`);
    if (n.disk_free_alarm) alarms.push(`Disk alarm on ${n.name}: ${fmtBytes(n.disk_free)} ` +
      `free, limit ${fmtBytes(n.disk_free_limit)}. Publishers are blocked.`);
    for (const s of n.failing_shards || []) alarms.push(`Shard ${s.shard} keeps failing ` +
      `(${s.restarts} restarts, last exit code ${s.exit_code}).`);
  }
  $("#alarms").hidden = !alarms.length;
  $("#alarms").replaceChildren(...alarms.map(text => h("div", {}, text)));
  $("#cluster").textContent = `${overview.cluster_name || ""} · ${overview.product_name ||
    "RabbitMQ"} ${overview.product_version || overview.rabbitmq_version || ""}`;
}

// The inspector page's logic: loads the wasm-bindgen build of the fingerprint core,
// runs the playground, and refreshes the live tables (replicas, cohorts, pivot, store,
// heatmap) from /ui/api/state every 2 s.
import init, { fingerprint_line } from "/ui/pkg/cohort_fingerprint_web.js";

const $ = (id) => document.getElementById(id);
const esc = (text) => String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
const cell = (text, left) => `<td${left ? ' class="l"' : ""}>${esc(text)}</td>`;

function fingerprint(prompt) {
  return JSON.parse(fingerprint_line(JSON.stringify({ text: prompt })));
}

async function playground() {
  const record = fingerprint($("prompt").value);
  const out = $("fingerprint");
  out.textContent = [
    `routing key  ${record.routing_key ?? "-"}`,
    `local cohort ${record.cohort ?? "-"} (the filter's own, before the batcher's)`,
    `sketch       ${record.sketch ?? "-"} (v${record.sketch_version ?? "?"})`,
    `sketch int8  ${JSON.stringify(record.sketch_i8 ?? [])}`,
    `intent text  ${record.intent_text ?? ""}`,
  ].join("\n");
  out.dataset.state = "done";
  out.dataset.sketch = JSON.stringify(record.sketch_i8 ?? []);
  const table = $("nearest");
  table.dataset.state = "loading";
  const reply = await fetch("/ui/api/nearest", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ tenant: $("tenant").value, sketch_i8: record.sketch_i8 ?? [] }),
  });
  const { nearest } = await reply.json();
  table.tBodies[0].innerHTML = nearest.length
    ? nearest.map((n) => `<tr>${cell(n.cohort, true)}${cell(n.similarity.toFixed(3))}</tr>`).join("")
    : `<tr>${cell("no live cohort of this tenant yet", true)}${cell("")}</tr>`;
  table.dataset.state = "done";
  table.dataset.first = nearest.length ? nearest[0].cohort : "";
}

function heatColour(n, max) {
  if (!n) return "#f4f4f4";
  const t = Math.min(1, Math.log1p(n) / Math.log1p(max));
  return `hsl(${(1 - t) * 60}, 90%, ${75 - t * 35}%)`;
}

// A replica's KV events stream: health, blocks held, seconds since its last message.
function kvEvents(kv) {
  if (!kv) return "not published";
  const lag = kv.messages_seen ? `${kv.lag_s} s ago` : `no message in ${kv.lag_s} s`;
  return `${kv.health} · ${kv.blocks_held} blocks · ${lag}`;
}

function kvEventsTitle(kv) {
  const t = kv.totals;
  return `${t.applied} applied, ${t.duplicates} duplicates, ${t.replays} replays, ${t.gaps_lost} gaps lost, `
    + `${t.restarts} restarts, ${t.malformed} malformed; residency ${kv.complete ? "complete" : "incomplete (a gap was lost)"}; `
    + "decisions use the modelled residency";
}

// One replica row: every cell names its column (data-col) for tests; numbers are plain.
function replicaRow(r) {
  const td = (col, text, { left, cls, title } = {}) => {
    const attrs = [`data-col="${col}"`, left || cls ? `class="${[left ? "l" : "", cls ?? ""].join(" ").trim()}"` : "", title ? `title="${esc(title)}"` : ""];
    return `<td ${attrs.filter(Boolean).join(" ")}>${esc(text)}</td>`;
  };
  const source = r.source === "static" ? "static" : `DNS ${r.endpoint ?? ""}`;
  const health = r.held_out_s != null ? `${r.health} (${r.held_out_s} s left)` : r.health;
  const probe = r.probe ? `${r.probe.up ? "answered" : "failed"} ${r.probe.age_s} s ago` : "not probed";
  const share = r.share_60s == null ? "—" : `${(r.share_60s * 100).toFixed(0)} % (${r.assigns_60s})`;
  const ttft = (q) => (r.ttft_ms ? `${r.ttft_ms[q]} ms` : "—");
  const ttftTitle = r.ttft_ms ? `${r.ttft_ms.samples} first-byte reports` : "no first byte reported in the last 5 min";
  return `<tr data-replica="${esc(r.name)}">${[
    td("name", r.name, { left: true }),
    td("source", source, { left: true }),
    td("health", health, { left: true, cls: r.available ? "ok" : "bad" }),
    td("probe", probe, { left: true, cls: r.probe ? (r.probe.up ? "" : "bad") : "muted", title: r.probe ? "" : "replicas known by name only are not probed" }),
    td("in_flight", r.in_flight, { title: `${r.assigned_total} assigned since start` }),
    td("share", share),
    td("ttft_p50", ttft("p50"), { title: ttftTitle }),
    td("ttft_p95", ttft("p95"), { title: ttftTitle }),
    td("blocks", r.blocks_resident, { title: `of ${r.blocks_capacity} modelled per replica` }),
    td("kv_events", kvEvents(r.kv_events), {
      left: true,
      cls: r.kv_events ? (r.kv_events.healthy ? "" : "bad") : "muted",
      title: r.kv_events ? kvEventsTitle(r.kv_events) : "no kv_events endpoint configured for this replica",
    }),
  ].join("")}</tr>`;
}

function render(state) {
  const b = state.batcher;
  $("status").textContent = `${b.cohorts_live} live cohorts · ${b.observations} observations · ${b.assigns} assigns`;
  const replicas = state.replicas ?? [];
  $("replicas").tBodies[0].innerHTML = replicas.length
    ? replicas.map(replicaRow).join("")
    : `<tr><td class="l muted" colspan="10">no replica known yet (discovery has found none)</td></tr>`;
  $("replicas").dataset.rows = String(replicas.length);
  $("cohorts").tBodies[0].innerHTML = b.cohorts
    .map((c) => `<tr>${cell(c.cohort, true)}${cell(c.tenant, true)}${cell(c.members)}${cell(c.idle_s)}</tr>`).join("");
  const sources = [...new Set(b.pivot.map((p) => p.source))].slice(0, 8);
  const rows = [...new Set(b.pivot.map((p) => p.cohort))].slice(0, 20);
  const count = (c, s) => b.pivot.find((p) => p.cohort === c && p.source === s)?.requests ?? "";
  $("pivot").tHead.innerHTML = `<tr><th class="l">cohort</th>${sources.map((s) => `<th>${s}</th>`).join("")}</tr>`;
  $("pivot").tBodies[0].innerHTML = rows.map((c) => `<tr>${cell(c, true)}${sources.map((s) => cell(count(c, s))).join("")}</tr>`).join("");
  $("store").tBodies[0].innerHTML = Object.entries(b.store).map(([k, v]) => `<tr>${cell(k, true)}${cell(v)}</tr>`).join("")
    + `<tr>${cell("semantic conflicts", true)}${cell(b.semantic_conflicts)}</tr>`;
  const heat = state.front;
  if (!heat) {
    $("heatmap").tBodies[0].innerHTML = `<tr><td class="l" style="width:auto">the batch front is not running (assign mode)</td></tr>`;
    return;
  }
  const max = Math.max(1, ...heat.columns.flatMap((c) => c.counts));
  const labels = [...heat.rows_ms.map((ms) => `≤${ms} ms`), `>${heat.rows_ms.at(-1)} ms`];
  $("heatmap").tBodies[0].innerHTML = labels.map((label, row) => `<tr><th class="l">${label}</th>${heat.columns
    .map((c) => `<td title="${c.counts[row]} requests, ${c.age_s} s ago" style="background:${heatColour(c.counts[row], max)}"></td>`).join("")}</tr>`).reverse().join("");
}

async function refresh() {
  try {
    render(await (await fetch("/ui/api/state")).json());
  } catch (e) {
    $("status").textContent = `cannot reach the batcher: ${e}`;
  }
}

await init();
// For tests: fingerprint many lines at once, with the browser build.
window.cohortSketches = (lines) => lines.map((line) => JSON.parse(fingerprint_line(line)).sketch_i8 ?? null);
$("go").addEventListener("click", () => playground().catch((e) => { $("fingerprint").textContent = String(e); }));
$("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("go").click(); } });
document.body.dataset.ready = "1";
refresh();
setInterval(refresh, 2000);

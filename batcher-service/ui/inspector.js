// The inspector page's logic: loads the wasm-bindgen build of the fingerprint core,
// runs the playground, and refreshes the live tables from /ui/api/state every 2 s.
import init, { fingerprint_line } from "/ui/pkg/cohort_fingerprint_web.js";

const $ = (id) => document.getElementById(id);
const cell = (text, left) => `<td${left ? ' class="l"' : ""}>${String(text).replace(/[&<>]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;" })[c])}</td>`;

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

function render(state) {
  const b = state.batcher;
  $("status").textContent = `${b.cohorts_live} live cohorts · ${b.observations} observations · ${b.assigns} assigns`;
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

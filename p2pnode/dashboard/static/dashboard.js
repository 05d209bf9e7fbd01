// p2pnode dashboard: polls this node's JSON endpoints and draws SVG. No library, no build step.
// Everything shown comes from the node; text from the network goes in with textContent only.
"use strict";

const POLL_MS = 2000;
const SVG_NS = "http://www.w3.org/2000/svg";
const history = [];  // points from /v1/history, oldest first, at most `capacity`
let lastSeq = 0;
let capacity = 600;

function el(tag, attrs = {}, text = null, ns = null) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== null) e.textContent = String(text);
  return e;
}
const svg = (tag, attrs = {}, text = null) => el(tag, attrs, text, SVG_NS);

function fmtNum(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number.isInteger(v) ? String(v) : v.toFixed(digits);
}
function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i === 0 ? String(Math.round(n)) : n.toFixed(n < 10 ? 2 : 1)) + " " + units[i];
}
const fmtPct = (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %");
const shortId = (id) => (id || "?").slice(0, 8);

async function getJSON(path) {
  const resp = await fetch(path, { cache: "no-store", credentials: "same-origin" });
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

// --- charts -------------------------------------------------------------------------------

// One line chart: `keys` name fields of the history points; y from 0 (or the data's minimum
// for the loss) to the data's maximum; x is wall-clock time, the same span on every chart.
function drawChart(id, keys, opts = {}) {
  const root = document.getElementById(id);
  const W = 360, H = 150, L = 58, R = 8, T = 8, B = 20;
  root.replaceChildren();
  const pts = keys.map((k) => history.filter((p) => p[k] !== null && p[k] !== undefined).map((p) => [p.t, p[k]]));
  root.dataset.points = String(pts[0].length);
  const all = pts.flat();
  if (all.length === 0) {
    root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "waiting for data…"));
    return;
  }
  const t0 = history[0].t, t1 = Math.max(history[history.length - 1].t, t0 + 1);
  let y0 = opts.min ?? Math.min(0, ...all.map((p) => p[1]));
  let y1 = opts.max ?? Math.max(...all.map((p) => p[1]));
  if (opts.fromData) y0 = Math.min(...all.map((p) => p[1]));
  if (y1 - y0 < 1e-9) { y1 = y0 + (Math.abs(y0) || 1) * 0.1; }
  const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  const y = (v) => T + (1 - (v - y0) / (y1 - y0)) * (H - T - B);
  root.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  for (const v of [y0, (y0 + y1) / 2, y1]) {
    root.append(svg("line", { x1: L, y1: y(v), x2: W - R, y2: y(v), class: "axis" }));
    root.append(svg("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end", class: "tick" }, (opts.fmt || fmtNum)(v)));
  }
  const span = t1 - t0;
  root.append(svg("text", { x: L, y: H - 5, class: "tick" }, `−${Math.round(span)} s`));
  root.append(svg("text", { x: W - R, y: H - 5, "text-anchor": "end", class: "tick" }, "now"));
  pts.forEach((series, i) => {
    if (series.length === 0) return;
    const d = series.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    root.append(svg("polyline", { points: d, class: `series s${i}` }));
  });
}

function drawCharts() {
  drawChart("chart-loss", ["loss"], { fromData: true, fmt: (v) => v.toFixed(3) });
  drawChart("chart-accuracy", ["accuracy"], { min: 0, max: 1, fmt: fmtPct });
  drawChart("chart-rate", ["samples_per_s"], { min: 0, fmt: (v) => v.toFixed(0) });
  drawChart("chart-bytes", ["bytes_in_per_s", "bytes_out_per_s"], { min: 0, fmt: fmtBytes });
}

// --- tables -------------------------------------------------------------------------------

function row(cells, cls = "") {
  const tr = el("tr", cls ? { class: cls } : {});
  for (const c of cells) {
    const [text, tdClass] = Array.isArray(c) ? c : [c, ""];
    tr.append(el("td", tdClass ? { class: tdClass } : {}, text));
  }
  return tr;
}

function drawCluster(view) {
  const body = document.querySelector("#cluster tbody");
  body.replaceChildren(...view.nodes.map((n) => row([
    shortId(n.node_id) + (n.self ? " (this)" : ""), n.addr || "–", [n.state || "–", `state-${n.state}`],
    n.reachable ? fmtNum(n.step) : (n.error ? "unreachable" : "–"), fmtNum(n.samples_per_s, 0), fmtNum(n.loss),
    fmtPct(n.accuracy), fmtNum(n.exchanges_done), fmtNum(n.exchanges_skipped), fmtBytes(n.bytes_in),
    fmtBytes(n.bytes_out), n.reachable ? (n.worker_alive ? (n.done ? "done" : "training") : "DOWN") : "–",
    fmtNum(n.label_skew, 2),
  ], n.self ? "self" : "")));
  const note = `${view.nodes.length} nodes` + (view.omitted ? `, ${view.omitted} more not shown` : "");
  document.getElementById("cluster-note").textContent = `(${note})`;
  // this node's mode and why (exchange.sync = "auto" picks it from the settings every node shares)
  const mode = view.mode || {};
  document.getElementById("node-mode").textContent = mode.name ? `mode: ${mode.name} (exchange.sync = ${mode.setting}: ${mode.why})` : "";
  const said = view.advice || mode.advice;
  const advice = document.getElementById("advice");
  advice.hidden = !said;
  advice.textContent = said ? `Advice: ${said}` : "";
}

function drawMembers(view) {
  const body = document.querySelector("#members tbody");
  const rank = (m) => (m.node_id === view.self ? "" : String(m.node_id));  // this node first
  const members = [...view.members].sort((x, y) => rank(x).localeCompare(rank(y)));
  body.replaceChildren(...members.map((m) => {
    const me = m.node_id === view.self;
    return row([shortId(m.node_id) + (me ? " (this)" : ""), m.addr, [m.state, `state-${m.state}`],
      fmtNum(m.incarnation), me ? "" : fmtNum(m.ok ?? 0), me ? "" : fmtNum(m.failed ?? 0), m.last_error || ""],
    me ? "self" : "");
  }));
}

// --- exchange graph ---------------------------------------------------------------------------

function drawGraph(view) {
  const root = document.getElementById("graph");
  root.replaceChildren();
  const nodes = view.nodes.filter((n) => n.node_id);
  const W = 400, cx = W / 2, cy = W / 2, rad = nodes.length > 1 ? W / 2 - 50 : 0;
  const pos = new Map();
  nodes.forEach((n, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / nodes.length;
    pos.set(n.node_id, [cx + rad * Math.cos(a), cy + rad * Math.sin(a)]);
  });
  // One undirected edge per pair: bytes both ways, recent when the node has two views to compare.
  const pairs = new Map();
  for (const e of view.edges) {
    if (!pos.has(e.src) || !pos.has(e.dst)) continue;
    const bytes = e.bytes_recent ?? e.bytes_total;
    if (!(bytes > 0)) continue;
    const key = [e.src, e.dst].sort().join(" ");
    const p = pairs.get(key) || { a: e.src, b: e.dst, bytes: 0, parts: [] };
    p.bytes += bytes;
    p.parts.push(`${shortId(e.src)} → ${shortId(e.dst)}: ${fmtBytes(bytes)}`);
    pairs.set(key, p);
  }
  const maxBytes = Math.max(1, ...[...pairs.values()].map((p) => p.bytes));
  for (const p of pairs.values()) {
    const [x1, y1] = pos.get(p.a), [x2, y2] = pos.get(p.b);
    const line = svg("line", { x1, y1, x2, y2, class: "edge", "stroke-width": (1.5 + 10 * Math.sqrt(p.bytes / maxBytes)).toFixed(1) });
    line.append(svg("title", {}, p.parts.join("\n")));
    root.append(line);
  }
  for (const n of nodes) {
    const [x, y] = pos.get(n.node_id);
    const cls = ["node", `state-${n.state}`, n.self ? "self" : "", n.reachable ? "" : "unreachable"].join(" ").trim();
    const g = svg("g", { class: cls, "data-node": n.node_id });
    g.append(svg("circle", { cx: x, cy: y, r: 24 }));
    g.append(svg("text", { x, y: y + 4, class: "label" }, shortId(n.node_id).slice(0, 6)));
    g.append(svg("text", { x, y: y + 38, class: "sub" }, n.reachable ? `step ${fmtNum(n.step)}` : (n.state || "")));
    g.append(svg("title", {}, `${n.node_id} at ${n.addr}\n${n.state}, loss ${fmtNum(n.loss)}, accuracy ${fmtPct(n.accuracy)}`));
    root.append(g);
  }
  root.dataset.edges = String(pairs.size);
  const when = view.window_s > 0 ? `over the last ${Math.round(view.window_s)} s` : "since each node started";
  document.getElementById("graph-note").textContent =
    `Edge width: model bytes fetched between the two nodes ${when}. Dashed: not answering.`;
}

// --- polling --------------------------------------------------------------------------------

function problem(text) {
  const p = document.getElementById("problem");
  p.hidden = !text;
  p.textContent = text || "";
}

async function poll() {
  try {
    const [hist, view] = await Promise.all([getJSON(`/v1/history?since=${lastSeq}`), getJSON("/v1/cluster")]);
    const me = view.nodes.find((n) => n.self) || {};
    if (hist.last_seq < lastSeq) history.length = 0;  // the node restarted: its sequence began again
    capacity = hist.capacity || capacity;
    for (const p of hist.points) history.push(p);
    history.splice(0, Math.max(0, history.length - capacity));
    lastSeq = hist.last_seq;
    document.getElementById("node-id").textContent = view.self;
    document.getElementById("node-addr").textContent = me.addr || "";
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.title = `p2pnode ${shortId(view.self)}: step ${fmtNum(me.step)}`;
    drawCharts();
    drawMembers(view);
    drawCluster(view);
    drawGraph(view);
    problem(null);
  } catch (err) {
    problem(`no data from this node: ${err.message}`);
  }
}

async function loop() {
  await poll();
  setTimeout(loop, POLL_MS);
}

document.addEventListener("DOMContentLoaded", loop);

// lowwater results page: plain JS, no build step, no external assets. Polls the REST API every few
// seconds; per query it charts the per-window total of one aggregate (inline SVG) over the hour up to
// the newest closed window and lists the top groups of that window; on top, the capture hosts.
// A time-range picker (relative or absolute) switches to stepped series (/series?step=, the step chosen
// from the range), the top groups over the range (/top) and one line per selected group (up to 8);
// drag on a chart or click a bucket to zoom in. The range lives in the URL hash (#range=7d,
// #from=...&to=..., #groups=3 preselects the top 3 groups, #filter=col:value sets the group filter),
// so a view can be linked.
"use strict";

const REFRESH_MS = 5000;
const TOP_N = 10;
const ROW_TABLE_N = 30;  // rows of a row-window query's table (its streams' newest windows)
const SVGNS = "http://www.w3.org/2000/svg";
const state = { queries: null, queriesAt: 0, chartAgg: {}, token: null, timer: null, webhook: false };
const initialHash = location.hash; // read before the token is taken out of it (live_s, live_query)
const RANGES = [["15m", 900], ["1h", 3600], ["6h", 21600], ["24h", 86400], ["7d", 604800], ["30d", 2592000]];
const STEPS_S = [1, 5, 10, 30, 60, 300, 900, 1800, 3600, 10800, 21600, 43200, 86400, 604800];
const MAX_POINTS = 240, MAX_LINES = 8;
const PALETTE = ["#2f6fde", "#d64545", "#1f9d55", "#c98a00", "#8e44ad", "#0f9aa8", "#e67e22", "#5d6d7e"];
// view.rel: a relative range in seconds up to now; view.from/to: an absolute one (ms); neither: auto
const view = { rel: null, from: null, to: null, filter: {}, groups: {}, preselect: 0, zoomStack: [] };

function hashParam(name) {
  const m = new RegExp("(?:^|[#&])" + name + "=([^&]*)").exec(initialHash);
  return m ? decodeURIComponent(m[1]) : null;
}
function writeHash() {
  const parts = [];
  if (view.rel) parts.push("range=" + (RANGES.find(([, s]) => s === view.rel) || [view.rel + "s"])[0]);
  else if (view.from !== null) parts.push("from=" + new Date(view.from).toISOString(), "to=" + new Date(view.to).toISOString());
  history.replaceState(null, "", location.pathname + location.search + (parts.length ? "#" + parts.join("&") : ""));
}
function durS(text) {
  const m = /^(\d+)([smhd])$/.exec(text || "");
  return m ? Number(m[1]) * { s: 1, m: 60, h: 3600, d: 86400 }[m[2]] : null;
}
// the [from, to) in ms the charts cover; null: auto (the hour up to each query's newest window)
function currentRange() {
  if (view.rel) { const to = Date.now(); return [to - view.rel * 1000, to]; }
  if (view.from !== null) return [view.from, view.to];
  return null;
}
// the smallest step (a multiple of the query's slide) that keeps the chart under MAX_POINTS buckets
// ``finestS``: the finest granularity kept at the range's start (finestKept), so a drill-down into
// a day older than the raw windows' retention asks a tier's steps, not raw windows that are gone
function chooseStep(spanMs, slideNs, finestS) {
  const slide = Math.max(1, Math.round(slideNs / 1e9)), unit = Math.max(slide, finestS || 1);
  const ok = STEPS_S.filter((st) => st >= unit && st % slide === 0 && st % unit === 0);
  return ok.find((st) => spanMs / 1000 / st <= MAX_POINTS) || ok[ok.length - 1] || unit;
}
// the finest granularity (s) the store keeps at ``fromMs``: the window slide while raw windows are
// kept there (their retention, from the query's definition), else the finest roll-up tier kept
function finestKept(q, fromMs) {
  const d = q.definition || {}, ret = d.retention || {};
  const kept = (name) => { const s = durS(ret[name]); return s === null || fromMs >= Date.now() - s * 1000; };
  if (!ret.raw || kept("raw")) return 0;
  const tiers = (d.tiers || []).map(durS).filter((s, i) => s && kept(d.tiers[i])).sort((a, b) => a - b);
  return tiers.length ? tiers[0] : 0;
}
function setRange(from, to, push) {
  if (push) view.zoomStack.push([view.rel, view.from, view.to]);
  if (from === null) { view.rel = null; view.from = view.to = null; }
  else { view.rel = null; view.from = Math.floor(from); view.to = Math.ceil(to); }
  writeHash(); renderRangeBar(); refresh();
}
function setRelative(sec) { view.zoomStack = []; view.rel = sec; view.from = view.to = null; writeHash(); renderRangeBar(); refresh(); }
function fmtWhen(ms, spanMs) {
  const iso = new Date(ms).toISOString();
  return spanMs > 86400000 * 2 ? iso.slice(5, 10) + " " + iso.slice(11, 16) : iso.slice(11, spanMs < 600000 ? 19 : 16);
}
function renderRangeBar() {
  const bar = document.getElementById("range-bar");
  if (!bar) return;
  bar.textContent = "";
  const btn = (label, on, active) => {
    const b = el("button", { type: "button", class: "rbtn" + (active ? " active" : ""), text: label });
    b.addEventListener("click", on); return b;
  };
  bar.append(btn("auto", () => { view.zoomStack = []; setRange(null); }, !view.rel && view.from === null));
  for (const [label, sec] of RANGES) bar.append(btn(label, () => setRelative(sec), view.rel === sec));
  const cur = currentRange();
  const toLocal = (ms) => new Date(ms).toISOString().slice(0, 16);
  const f = el("input", { type: "datetime-local", id: "range-from", "aria-label": "from (UTC)" });
  const t = el("input", { type: "datetime-local", id: "range-to", "aria-label": "to (UTC)" });
  if (cur) { f.value = toLocal(cur[0]); t.value = toLocal(cur[1]); }
  const apply = btn("apply", () => {
    const a = Date.parse(f.value + "Z"), b = Date.parse(t.value + "Z");
    if (Number.isFinite(a) && Number.isFinite(b) && a < b) { view.zoomStack = []; setRange(a, b); }
    else showError("from/to: give two UTC times, from before to");
  });
  bar.append(el("span", { class: "rsep" }, "from ", f, " to ", t, " UTC "), apply);
  if (view.zoomStack.length) {
    bar.append(btn("zoom out", () => {
      const [rel, from, to] = view.zoomStack.pop();
      view.rel = rel; view.from = from; view.to = to; writeHash(); renderRangeBar(); refresh();
    }, false));
  }
  const note = el("span", { class: "rnote", id: "range-note" });
  if (cur) note.textContent = `${fmtWhen(cur[0], cur[1] - cur[0])} – ${fmtWhen(cur[1], cur[1] - cur[0])} UTC · drag on a chart or click a bucket to zoom`;
  else note.textContent = "the hour up to each query's newest closed window";
  bar.append(note);
}
function initRange() {
  const r = hashParam("range"), from = hashParam("from"), to = hashParam("to");
  const rel = RANGES.find(([label]) => label === r);
  if (rel) view.rel = rel[1]; else if (r && durS(r)) view.rel = durS(r);
  else if (from && to && Date.parse(from) < Date.parse(to)) { view.from = Date.parse(from); view.to = Date.parse(to); }
  view.preselect = Math.min(MAX_LINES, Number(hashParam("groups")) || 0);
  view.hashFilter = hashParam("filter");  // #filter=src_ip:10.0.0.0/8: the group filter of every card with that column
  renderRangeBar();
}

// ---- token: #token=... in the URL, else local storage; asked for on a 401
function initToken() {
  const m = /(?:^|[#&])token=([^&]+)/.exec(location.hash);
  if (m) {
    state.token = decodeURIComponent(m[1]);
    try { localStorage.setItem("lowwater_token", state.token); } catch (e) { /* private mode */ }
    history.replaceState(null, "", location.pathname + location.search);
  } else {
    try { state.token = localStorage.getItem("lowwater_token"); } catch (e) { state.token = null; }
  }
  document.getElementById("auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = document.getElementById("auth-token").value.trim() || null;
    try { localStorage.setItem("lowwater_token", state.token || ""); } catch (e) { /* ignore */ }
    document.getElementById("auth").style.display = "none";
    refresh();
  });
}

class AuthError extends Error {}

async function api(path) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const r = await fetch(path, { headers, cache: "no-store" });
  if (r.status === 401) throw new AuthError("token required");
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail || detail; } catch (e) { /* not JSON */ }
    throw new Error(`${path}: ${r.status} ${detail}`);
  }
  return r.json();
}

// ---- small DOM helpers
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

// ---- formatting
function fmtNum(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  if (!Number.isInteger(v)) return v.toLocaleString("en-US", { maximumFractionDigits: 2 });
  return v.toLocaleString("en-US");
}
function fmtShort(v) {
  const a = Math.abs(v);
  const units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
  for (const [d, u] of units) if (a >= d) return (v / d).toFixed(a / d >= 100 ? 0 : 1).replace(/\.0$/, "") + u;
  return Number.isInteger(v) ? String(v) : v.toFixed(a < 10 ? 2 : 1);
}
function pad(n) { return String(n).padStart(2, "0"); }
function fmtTime(ms, withSec) {
  const d = new Date(ms);
  return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + (withSec ? ":" + pad(d.getUTCSeconds()) : "");
}
function fmtDur(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function fmtSpan(ns) {
  const s = ns / 1e9;
  return s % 3600 === 0 ? s / 3600 + "h" : s % 60 === 0 ? s / 60 + "m" : s + "s";
}

// ---- completeness: why a window (or a group of it) is not known to be exact (contract/results.py)
function incompleteWhy(r) {
  if (r.complete !== false) return "";
  const why = [];
  if (r.hosts_in_mark < r.hosts_expected) {
    why.push(`${r.hosts_expected - r.hosts_in_mark} of ${r.hosts_expected} capture hosts had not passed the window when it closed (dead or not heard)`);
  }
  if (r.late_partials > 0) why.push(`${fmtNum(r.late_partials)} late partial records counted`);
  const shed = r.shed_records || 0;  // /series: records a capture host's backlog shed (flagged windows)
  if (r.flagged && r.groups === 0) why.push("no rows: every record of this window was shed or lost");
  if (shed > 0) why.push(`${fmtNum(shed)} records shed by a capture host's backlog`);
  if (r.missing_records > shed) why.push(`${fmtNum(r.missing_records - shed)} records missing (sequence gap${shed ? "" : " or shed"})`);
  if (r.incomplete_groups > 0) why.push(`${fmtNum(r.incomplete_groups)} groups incomplete`);
  if (r.loss_causes) why.push(`lost: ${r.loss_causes}`);  // which host, which cause, how many (flagged windows)
  return "incomplete: " + (why.join("; ") || "provisional");
}

// ---- the chart (inline SVG, drawn by hand)
function niceStep(span, target) {
  const raw = span / Math.max(1, target);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const n = raw / mag;
  return (n <= 1 ? 1 : n <= 2 ? 2 : n <= 5 ? 5 : 10) * mag;
}
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400].map((s) => s * 1000);

// ``opts.lines``: more series [{name, points}] drawn as coloured lines with a legend (selected groups);
// ``opts.zoom(from, to)``: drag across the chart or click a point to zoom to it (``opts.stepMs`` wide)
function drawChart(host, points, label, opts) {
  opts = opts || {};
  host.textContent = "";
  const lines = opts.lines || [];
  if (lines.length) points = lines.flatMap((l) => l.points);
  if (!points.length) { host.append(el("div", { class: "empty", text: "no closed windows in this range yet" })); return; }
  const W = Math.max(320, host.clientWidth || 640), H = 210;
  const m = { l: 52, r: 14, t: 12, b: 26 };
  const iw = W - m.l - m.r, ih = H - m.t - m.b;
  const xs = points.map((p) => p.t), ys = points.map((p) => p.v).filter((v) => v !== null);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (opts.span) { x0 = opts.span[0]; x1 = Math.max(x0 + 1, opts.span[1] - (opts.stepMs || 0)); }
  if (x0 === x1) { x0 -= 30000; x1 += 30000; }
  let y0 = Math.min(0, ...ys), y1 = Math.max(...ys, 0);
  if (y1 === y0) y1 = y0 + 1;
  const ystep = niceStep(y1 - y0, 4);
  y1 = Math.ceil(y1 / ystep) * ystep; y0 = Math.floor(y0 / ystep) * ystep;
  const X = (t) => m.l + ((t - x0) / (x1 - x0)) * iw;
  const Y = (v) => m.t + ih - ((v - y0) / (y1 - y0)) * ih;

  const s = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": label });
  const hatch = svg("pattern", { id: "lw-hatch", width: 4, height: 4, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
  hatch.append(svg("rect", { width: 4, height: 4, class: "hatch-bg" }), svg("line", { x1: 0, y1: 0, x2: 0, y2: 4, class: "hatch-line" }));
  const defs = svg("defs"); defs.append(hatch); s.append(defs);
  const grid = svg("g", { class: "grid" }), axis = svg("g", { class: "axis" });
  for (let v = y0; v <= y1 + ystep / 2; v += ystep) {
    grid.append(svg("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v) }));
    const t = svg("text", { x: m.l - 6, y: Y(v) + 3.5, "text-anchor": "end" }); t.textContent = fmtShort(v); axis.append(t);
  }
  const tstep = TIME_STEPS.find((st) => (x1 - x0) / st <= 7) || Math.ceil((x1 - x0) / 7 / 86400000) * 86400000;
  for (let t = Math.ceil(x0 / tstep) * tstep; t <= x1; t += tstep) {
    const anchor = X(t) > W - m.r - 18 ? "end" : X(t) < m.l + 18 ? "start" : "middle";  // keep edge labels inside
    const tx = svg("text", { x: X(t), y: H - 8, "text-anchor": anchor });
    tx.textContent = x1 - x0 > 2 * 86400000 ? new Date(t).toISOString().slice(5, 10) : fmtTime(t, tstep < 60000); axis.append(tx);
    grid.append(svg("line", { x1: X(t), x2: X(t), y1: m.t + ih, y2: m.t + ih + 4 }));
  }
  s.append(grid, axis);
  if (lines.length) {  // one line per selected group, with a legend
    const legend = el("div", { class: "legend" });
    lines.forEach((l, i) => {
      const lp = l.points.filter((p) => p.v !== null);
      const d = lp.map((p, j) => (j ? "L" : "M") + X(p.t).toFixed(1) + "," + Y(p.v).toFixed(1)).join("");
      s.append(svg("path", { class: "line group-line", d, style: "stroke:" + PALETTE[i % PALETTE.length], "data-group": l.name }));
      legend.append(el("span", { class: "lg" }, el("i", { style: "background:" + PALETTE[i % PALETTE.length] }), l.name));
    });
    zoomable(s, X, x0, x1, W, m, iw, ih, opts);
    host.append(s, legend);
    return;
  }
  const pts = points.filter((p) => p.v !== null);
  const line = pts.map((p, i) => (i ? "L" : "M") + X(p.t).toFixed(1) + "," + Y(p.v).toFixed(1)).join("");
  if (pts.length > 1) {
    s.append(svg("path", { class: "area", d: line + `L${X(pts[pts.length - 1].t).toFixed(1)},${Y(Math.max(0, y0))}L${X(pts[0].t).toFixed(1)},${Y(Math.max(0, y0))}Z` }));
  }
  s.append(svg("path", { class: "line", d: line }));
  for (const p of pts) {  // every incomplete window is marked (a hatched point); complete ones only when few
    if (!p.why && pts.length > 90 && !(opts.zoom && p.v)) continue;  // zoomable: every bucket with a value
    const c = svg("circle", { class: p.why ? "dot incomplete" : "dot", cx: X(p.t), cy: Y(p.v),
      r: p.why ? 4.2 : pts.length <= 30 ? 2.6 : 1.6 });
    const tt = svg("title"); tt.textContent = `${fmtTime(p.t, true)} UTC  ${fmtNum(p.v)}${p.why ? "\n" + p.why : ""}`;
    c.append(tt); s.append(c);
    if (opts.zoom && opts.stepMs) {  // click a bucket: drill down into it
      c.setAttribute("data-bucket", "zoom");
      c.addEventListener("click", (ev) => { ev.stopPropagation(); opts.zoom(p.t, p.t + opts.stepMs); });
    }
  }
  // a flagged window without rows (every record shed or lost) has no value: a hatched mark on the axis
  for (const p of points) {
    if (p.v !== null || !p.why) continue;
    const r = svg("rect", { class: "dot incomplete empty", x: X(p.t) - 4, y: Y(Math.max(0, y0)) - 9, width: 8, height: 9 });
    const tt = svg("title"); tt.textContent = `${fmtTime(p.t, true)} UTC  no value\n${p.why}`;
    r.append(tt); s.append(r);
  }
  // hover read-out
  const hover = svg("g", { class: "hover", visibility: "hidden" });
  const hl = svg("line", { y1: m.t, y2: m.t + ih }), box = svg("rect", { rx: 4, height: 20 }), txt = svg("text", {});
  hover.append(hl, box, txt); s.append(hover);
  s.addEventListener("mousemove", (ev) => {
    const r = s.getBoundingClientRect();
    const t = x0 + ((ev.clientX - r.left) * (W / r.width) - m.l) / iw * (x1 - x0);
    let best = pts[0];
    for (const p of pts) if (Math.abs(p.t - t) < Math.abs(best.t - t)) best = p;
    const x = X(best.t);
    hl.setAttribute("x1", x); hl.setAttribute("x2", x);
    txt.textContent = `${fmtTime(best.t, true)}  ${fmtNum(best.v)}${best.why ? "  (incomplete)" : ""}`;
    const w = txt.textContent.length * 6.4 + 12, bx = Math.min(Math.max(m.l, x - w / 2), W - m.r - w);
    box.setAttribute("x", bx); box.setAttribute("y", m.t); box.setAttribute("width", w);
    txt.setAttribute("x", bx + 6); txt.setAttribute("y", m.t + 14);
    hover.setAttribute("visibility", "visible");
  });
  s.addEventListener("mouseleave", () => hover.setAttribute("visibility", "hidden"));
  zoomable(s, X, x0, x1, W, m, iw, ih, opts);
  host.append(s);
}

// drag across the plot to zoom to the dragged span (a shaded band while dragging)
function zoomable(s, X, x0, x1, W, m, iw, ih, opts) {
  if (!opts.zoom) return;
  s.setAttribute("data-zoom", "drag");
  const band = svg("rect", { class: "zoom-band", y: m.t, height: ih, width: 0, visibility: "hidden" });
  s.append(band);
  const tAt = (ev) => { const r = s.getBoundingClientRect(); return x0 + ((ev.clientX - r.left) * (W / r.width) - m.l) / iw * (x1 - x0); };
  let startT = null;
  s.addEventListener("mousedown", (ev) => { startT = tAt(ev); ev.preventDefault(); });
  s.addEventListener("mousemove", (ev) => {
    if (startT === null) return;
    const a = X(Math.min(startT, tAt(ev))), b = X(Math.max(startT, tAt(ev)));
    band.setAttribute("x", a); band.setAttribute("width", Math.max(0, b - a)); band.setAttribute("visibility", "visible");
  });
  s.addEventListener("mouseup", (ev) => {
    if (startT === null) return;
    const a = Math.min(startT, tAt(ev)), b = Math.max(startT, tAt(ev));
    startT = null; band.setAttribute("visibility", "hidden");
    if (b - a > (x1 - x0) / 200) opts.zoom(a, b + (opts.stepMs || 0));
  });
}

// ---- host status
const END_OF_STREAM_NS = 9.2e18;
function fmtMark(ns) {
  if (ns === null || ns === undefined) return "–";
  if (ns >= END_OF_STREAM_NS) return "end of capture";
  return new Date(ns / 1e6).toISOString().replace("T", " ").replace("Z", "");
}
function renderStatus(st) {
  state.webhook = Boolean(st.settings && st.settings.alert_webhook);
  const sub = document.getElementById("status-sub"), body = document.getElementById("status-body");
  body.textContent = "";
  if (!st.available) {
    sub.textContent = st.error || "status not available";
    return;
  }
  const age = st.age_s === null ? "unknown" : fmtDur(st.age_s) + " ago";
  sub.textContent = "";
  sub.append(`status written ${age}`);
  if (st.store_bytes !== null && st.store_bytes !== undefined) {
    const keep = st.settings && st.settings.retention_days ? `, kept ${st.settings.retention_days} days` : "";
    sub.append(` · results store ${fmtNum(Math.round(st.store_bytes / 1e6))} MB${keep}`);
  }
  if (st.stale) sub.append(" ", el("span", { class: "warn", text: "(stale: is the high-level job running?)" }));
  const row = el("div", { class: "statusrow" });
  for (const [name, q] of Object.entries(st.queries || {})) {
    const item = el("div", {}, el("code", { text: name }), " · open windows ", el("b", { text: fmtNum(q.open_windows) }),
      " · capture hosts live ", el("b", { text: `${q.hosts_live}/${q.hosts_total}` }),
      " · Kafka partitions ", el("b", { text: fmtNum(q.partitions_total) }));
    if (q.open_windows && q.blocked_by && q.blocked_by.length) item.append(" · ", el("span", { class: "warn", text: "waiting for " + q.blocked_by.join(", ") }));
    row.append(item);
  }
  body.append(row);
  const hosts = st.hosts || [];
  if (!hosts.length) { body.append(el("div", { class: "empty", text: "no capture hosts reported yet" })); return; }
  const counters = ["records", "late_partials", "missing_records", "restarts"];
  const head = el("tr", {}, el("th", { text: "capture host" }), el("th", { text: "state" }), el("th", { text: "low-water mark (UTC)" }),
    el("th", { class: "num", text: "lag" }), ...counters.map((c) => el("th", { class: "num", text: c.replace(/_/g, " ") })),
    el("th", { text: "queries" }));
  const tb = el("tbody");
  const hostRow = (h, label, state) => {
    const dot = h.live ? "dot-live" : "dot-dead";
    const lag = el("td", { class: "num", text: fmtDur(h.lag_s) });
    if (h.lag_s !== null && h.lag_s > 30) lag.className = "num warn";
    return el("tr", {}, el("td", { class: "key", text: label }),
      el("td", {}, el("span", { class: dot }), state || (h.live ? "live" : "silent")),
      el("td", { text: fmtMark(h.low_water_mark_ns) }),
      lag, ...counters.map((c) => el("td", { class: "num" + (h[c] && c !== "records" ? " warn" : ""), text: fmtNum(h[c]) })),
      el("td", { text: (h.queries || []).join(", ") }));
  };
  // workers H/w0 ... of a capture host run with --workers: one row for the host, its workers under it
  const byName = Object.fromEntries(hosts.map((h) => [h.host, h]));
  const groups = st.capture_hosts && st.capture_hosts.length ? st.capture_hosts : hosts.map((h) => ({ ...h, workers: [h.host] }));
  for (const g of groups) {
    const solo = g.workers.length === 1 && g.workers[0] === g.host;
    if (solo) { tb.append(hostRow(byName[g.host] || g, g.host)); continue; }
    tb.append(hostRow(g, g.host, `${g.workers_live}/${g.workers.length} workers live`));
    for (const w of g.workers) if (byName[w]) tb.append(hostRow(byName[w], "\u2003" + w));
  }
  body.append(el("table", { class: "hosts" }, el("thead", {}, head), tb));
}

// ---- alerts fired on closed windows
function renderAlerts(a) {
  const body = document.getElementById("alerts-body");
  body.textContent = "";
  if (!a || a.error) { body.append(el("div", { class: "empty", text: (a && a.error) || "alerts not available" })); return; }
  if (!a.alerts.length) { body.append(el("div", { class: "empty", text: "no alerts fired" })); return; }
  const head = el("tr", {}, ...["closed (UTC)", "query", "alert", "severity", "window", "group", "values", "webhook"]
    .map((t) => el("th", { text: t })));
  const tb = el("tbody");
  for (const r of a.alerts) {
    const sev = r.severity === "critical" ? "bad" : r.severity === "warning" ? "warn" : "";
    tb.append(el("tr", {}, el("td", { text: r.closed_at.replace("T", " ").replace("Z", "") }), el("td", { class: "key", text: r.query }),
      el("td", { class: "key", text: r.alert }), el("td", { class: sev, text: r.severity }),
      el("td", { text: `${r.window_start.slice(11, 19)}–${r.window_end.slice(11, 19)}` }),
      el("td", { class: "key", text: Object.entries(r.group).map(([k, v]) => `${k}=${v}`).join(" ") || "(all)" }),
      el("td", { class: "key", text: Object.entries(r.values).map(([k, v]) => `${k}=${fmtNum(v)}`).join(" ") }),
      el("td", { class: r.delivered || !state.webhook ? "" : "warn",
        text: r.delivered ? "delivered" : state.webhook ? "pending" : "no webhook set" })));
  }
  body.append(el("table", {}, el("thead", {}, head), tb));
  document.getElementById("alerts-sub").textContent = `${a.total} fired · newest ${a.returned} shown · once per window and group, at close`;
}

// ---- one query card
function card(q) {
  let c = document.getElementById("q-" + q.name);
  if (c) return c;
  const w = q.window;
  const win = w.tumbling ? `tumbling ${fmtSpan(w.range_ns)}` : `${fmtSpan(w.range_ns)} sliding every ${fmtSpan(w.slide_ns)}`;
  const aggSel = el("select", { "aria-label": "aggregate to chart" });
  for (const a of q.aggregate_columns) aggSel.append(el("option", { value: a.name, text: a.name }));
  aggSel.value = state.chartAgg[q.name] || q.aggregate_columns[0].name;
  aggSel.addEventListener("change", () => { state.chartAgg[q.name] = aggSel.value; refreshQuery(q); });
  const gf = el("input", { class: "gfilter", type: "text", "aria-label": "group filter",
    placeholder: "group filter, e.g. " + (q.key_columns.length ? q.key_columns[0].name + (q.key_columns[0].kind === "ip" ? ":10.0.0.0/8" : ":443") : "(no groups)") });
  const terms = (view.hashFilter || "").split(/[\s,]+/).filter(Boolean);
  if (view.filter[q.name] === undefined && terms.length && terms.every((t) => q.key_columns.some((k) => t.split(":")[0] === k.name))) {
    view.filter[q.name] = view.hashFilter;
  }
  gf.value = view.filter[q.name] || "";
  gf.addEventListener("change", () => { view.filter[q.name] = gf.value.trim(); view.groups[q.name] = []; refreshQuery(q).catch((e) => showError(e.message)); });
  c = el("section", { class: "card query", id: "q-" + q.name },
    el("h2", {}, el("code", { text: q.name }), q.key_columns.length ? gf : ""),
    el("div", { class: "sub" }, el("span", { class: "pill", text: win }),
      el("span", { class: "pill", text: "by " + (q.key_columns.map((k) => k.name).join(", ") || "(all)") }),
      q.description || ""),
    el("div", { class: "grid" },
      el("div", {}, el("h3", {}, "total per window ", aggSel, " ", el("span", { class: "h3note range" })), el("div", { class: "chart-host" })),
      el("div", {}, el("h3", {}, el("span", { class: "top-title", text: `top ${TOP_N} · latest window ` }), el("span", { class: "h3note latest" })), el("div", { class: "top-host" }))));
  document.getElementById("queries").append(c);
  return c;
}

// a port's (or exporter's) name and speed beside its ifIndex, when the API has an interfaces file
function portName(r, k) {
  const n = r[k + "_name"], sp = r[k + "_speed"];
  if (n === undefined || n === null) return "";
  return ` · ${n}` + (sp ? ` (${sp >= 1000 ? sp / 1000 + "G" : sp + "M"})` : "");
}

function renderTop(host, q, latest) {
  host.textContent = "";
  if (!latest.window_start || !latest.rows.length) { host.append(el("div", { class: "empty", text: "no closed window yet" })); return; }
  const keys = q.key_columns.map((k) => k.name), aggs = q.aggregate_columns.map((a) => a.name);
  const first = aggs[0];
  const max = Math.max(1, ...latest.rows.map((r) => Math.abs(r[first] || 0)));
  const head = el("tr", {}, el("th", { class: "rank", text: "#" }), ...keys.map((k) => el("th", { text: k })),
    ...aggs.map((a) => el("th", { class: "num", text: a })));
  const tb = el("tbody");
  for (const r of latest.rows) {
    const cells = aggs.map((a, i) => {
      if (i) return el("td", { class: "num", text: fmtNum(r[a]) });
      const bar = el("i"); bar.style.width = (100 * Math.abs(r[a] || 0) / max).toFixed(1) + "%";
      return el("td", { class: "num bar" }, bar, el("span", { text: fmtNum(r[a]) }));
    });
    const why = incompleteWhy(r);
    tb.append(el("tr", why ? { class: "top-row incomplete", title: why } : { class: "top-row" }, el("td", { class: "rank", text: r.rank }),
      ...keys.map((k) => el("td", { class: "key", text: r[k] === null ? "–" : String(r[k]) + portName(r, k) })), ...cells));
  }
  host.append(el("table", { class: "topn" }, el("thead", {}, head), tb));
}

// ---- a row-window query (kind: rows): a table of each stream's newest window, incomplete ones hatched
function rowCard(q) {
  let c = document.getElementById("r-" + q.name);
  if (c) return c;
  const w = q.window;
  const win = w.every ? `the last ${w.range}, every ${w.every} rows`  // slide-by-tuple
    : w.slide === w.rows ? `tumbling ${w.rows} rows` : `${w.rows} rows sliding every ${w.slide}`;
  c = el("section", { class: "card query rows", id: "r-" + q.name },
    el("h2", {}, el("code", { text: q.name })),
    el("div", { class: "sub" }, el("span", { class: "pill", text: win }),
      el("span", { class: "pill", text: "numbered per " + (["host", ...(w.partition_by || [])].join(", ")) }),
      q.description || ""),
    el("h3", {}, "newest window of each host and partition ", el("span", { class: "h3note latest" })),
    el("div", { class: "rows-host" }));
  document.getElementById("queries").append(c);
  return c;
}

async function refreshRowQuery(q) {
  const c = rowCard(q);
  const latest = await api(`/queries/${encodeURIComponent(q.name)}/latest?order_by=-closed_at,host,window&limit=${ROW_TABLE_N}`);
  const host = c.querySelector(".rows-host");
  host.textContent = "";
  const rows = latest.rows || [];
  c.querySelector(".h3note.latest").textContent = rows.length ? `${latest.paging.total} rows` : "";
  if (!rows.length) { host.append(el("div", { class: "empty", text: "no closed window yet" })); return; }
  const keys = q.key_columns.map((k) => k.name), aggs = q.aggregate_columns.map((a) => a.name);
  const head = el("tr", {}, ...keys.map((k) => el("th", { text: k })), el("th", { text: "window" }),
    el("th", { text: "rows" }), ...aggs.map((a) => el("th", { class: "num", text: a })), el("th", { text: "closed" }));
  const tb = el("tbody");
  for (const r of rows) {
    const why = r.complete === false
      ? `incomplete: ${fmtNum(r.missing_records)} records lost where these rows were numbered (capture drops or a sequence gap)` : "";
    tb.append(el("tr", why ? { class: "row-window incomplete", title: why } : { class: "row-window" },
      ...keys.map((k) => el("td", { class: "key", text: r[k] === null ? "–" : String(r[k]) })),
      el("td", { class: "num", text: String(r.window) }),
      el("td", { class: "num", text: r.window_end ? `to ${fmtTime(Date.parse(r.window_end), true)}`
        : `${r.first_row}–${r.end_row - 1}` }),
      ...aggs.map((a) => el("td", { class: "num", text: fmtNum(r[a]) })),
      el("td", { text: fmtTime(Date.parse(r.closed_at), true) })));
  }
  host.append(el("table", { class: "topn" }, el("thead", {}, head), tb));
}

// the group filter of a card as query parameters: "col:value" terms separated by spaces or commas
function filterParams(q) {
  const text = (view.filter[q.name] || "").trim();
  return text ? text.split(/[\s,]+/).filter(Boolean).map((f) => "&filter=" + encodeURIComponent(f)).join("") : "";
}
function groupName(q, g) { return q.key_columns.map((k) => String(g[k.name])).join(" → "); }
function sameGroup(q, a, b) { return q.key_columns.every((k) => a[k.name] === b[k.name]); }

// the points of a stepped series; a count or sum is 0 in a step without rows (not a gap to bridge)
function fillSteps(sr, agg, additive, stepMs) {
  const got = new Map(sr.rows.map((r) => [Date.parse(r.window_start), r]));
  if (!additive) return sr.rows.map((r) => ({ t: Date.parse(r.window_start), v: r[agg], why: incompleteWhy(r) }));
  const out = [];
  for (let t = Date.parse(sr.start); t < Date.parse(sr.end); t += stepMs) {
    const r = got.get(t);
    out.push({ t, v: r ? r[agg] : 0, why: r ? incompleteWhy(r) : "" });
  }
  return out;
}

// a chosen range: stepped series (one line per selected group, or the total), top groups over the range
async function refreshRange(q, c, from, to) {
  const stepS = chooseStep(to - from, q.window.slide_ns, finestKept(q, from));
  const base = `/queries/${encodeURIComponent(q.name)}`;
  const qs = `start=${encodeURIComponent(new Date(from).toISOString())}&end=${encodeURIComponent(new Date(to).toISOString())}&step=${stepS}s`;
  const flt = filterParams(q);
  const agg = state.chartAgg[q.name] || q.aggregate_columns[0].name;
  const adds = q.aggregate_columns.filter((a) => a.fn === "count" || a.fn === "sum").map((a) => a.name);
  const keys = q.key_columns.map((k) => k.name);
  const top = adds.length && keys.length
    ? await api(`${base}/top?${qs}${flt}&n=${TOP_N}&by=${encodeURIComponent(adds.includes(agg) ? agg : adds[0])}`) : null;
  if (view.preselect && top && view.groups[q.name] === undefined) {
    view.groups[q.name] = top.rows.filter((r) => keys.every((k) => r[k] !== null)).slice(0, view.preselect);
  }
  const sel = view.groups[q.name] || [];
  const stepMs = stepS * 1000;
  let total = null, lines = [];
  if (sel.length) {
    lines = await Promise.all(sel.map(async (g) => {
      const gf = keys.map((k) => "&filter=" + encodeURIComponent(`${k}:${g[k]}`)).join("");
      const sr = await api(`${base}/series?${qs}${flt}${gf}`);
      return { name: groupName(q, g), points: fillSteps(sr, agg, adds.includes(agg), stepMs) };
    }));
  } else {
    total = await api(`${base}/series?${qs}${flt}`);
  }
  const shown = total || { start: new Date(from).toISOString(), end: new Date(to).toISOString(), tier: "raw" };
  const span = [Date.parse(shown.start), Date.parse(shown.end)];
  const zoom = (a, b) => setRange(Math.max(span[0], a), Math.min(span[1], b), true);
  const pts = total ? fillSteps(total, agg, adds.includes(agg), stepMs) : [];
  drawChart(c.querySelector(".chart-host"), pts, `${q.name}: ${agg} per ${fmtSpan(stepMs * 1e6)}`, { span, stepMs, zoom, lines });
  c.querySelector(".range").textContent = `· per ${fmtSpan(stepMs * 1e6)} step · ${fmtWhen(span[0], span[1] - span[0])} – ${fmtWhen(span[1], span[1] - span[0])} UTC`
    + ` · tier ${(top || shown).tier}` + (sel.length ? ` · ${sel.length} selected group${sel.length > 1 ? "s" : ""}` : "");
  c.querySelector(".latest").textContent = "";
  c.querySelector(".top-title").textContent = top ? `top ${TOP_N} over the range by ${top.by} · click to chart (up to ${MAX_LINES})` : "top groups over the range: needs a count or sum aggregate";
  renderRangeTop(c.querySelector(".top-host"), q, top, sel);
}

function renderRangeTop(host, q, top, sel) {
  host.textContent = "";
  if (!top || !top.rows.length) { host.append(el("div", { class: "empty", text: "no groups in this range" })); return; }
  const keys = q.key_columns.map((k) => k.name), cols = top.columns.filter((c) => !keys.includes(c) && c !== "rank");
  const max = Math.max(1, ...top.rows.map((r) => Math.abs(r[top.by] || 0)));
  const head = el("tr", {}, el("th", { class: "rank", text: "#" }), ...keys.map((k) => el("th", { text: k })),
    ...cols.map((a) => el("th", { class: "num", text: a })));
  const tb = el("tbody");
  top.rows.forEach((r, i) => {
    const on = sel.findIndex((g) => sameGroup(q, g, r));
    const cells = cols.map((a) => {
      if (a !== top.by) return el("td", { class: "num", text: fmtNum(r[a]) });
      const bar = el("i"); bar.style.width = (100 * Math.abs(r[a] || 0) / max).toFixed(1) + "%";
      return el("td", { class: "num bar" }, bar, el("span", { text: fmtNum(r[a]) }));
    });
    const sw = el("i", { class: "swatch" }); if (on >= 0) sw.style.background = PALETTE[on % PALETTE.length];
    const tr = el("tr", { class: "range-row" + (on >= 0 ? " selected" : ""), title: "click: chart this group" },
      el("td", { class: "rank" }, sw, String(r.rank || i + 1)), ...keys.map((k) => el("td", { class: "key", text: r[k] === null ? "–" : String(r[k]) })), ...cells);
    tr.addEventListener("click", () => {
      const cur = view.groups[q.name] || [];
      const j = cur.findIndex((g) => sameGroup(q, g, r));
      if (j >= 0) cur.splice(j, 1); else if (cur.length < MAX_LINES && keys.every((k) => r[k] !== null)) cur.push(r);
      view.groups[q.name] = cur;
      refreshQuery(q).catch((e) => showError(e.message));
    });
    tb.append(tr);
  });
  host.append(el("table", { class: "topn" }, el("thead", {}, head), tb));
}

async function refreshQuery(q) {
  const c = card(q);
  const range = currentRange();
  if (range) return refreshRange(q, c, range[0], range[1]);
  c.querySelector(".top-title").textContent = `top ${TOP_N} · latest window `;
  const flt = filterParams(q);
  const latest = await api(`/queries/${encodeURIComponent(q.name)}/latest?top=${TOP_N}${flt}`);
  let seriesUrl = `/queries/${encodeURIComponent(q.name)}/series?`;
  if (latest.window_start) {
    const t = Date.parse(latest.window_start);
    const start = new Date(t - 3600 * 1000).toISOString(), end = new Date(t + 1000).toISOString();
    seriesUrl += `start=${encodeURIComponent(start)}&end=${encodeURIComponent(end)}`;
  }
  seriesUrl += flt;
  const series = await api(seriesUrl);
  const agg = state.chartAgg[q.name] || q.aggregate_columns[0].name;
  const pts = series.rows.map((r) => ({ t: Date.parse(r.window_start), v: r[agg], why: incompleteWhy(r) }));
  const stepMs = q.window.slide_ns / 1e6;
  drawChart(c.querySelector(".chart-host"), pts, `${q.name}: ${agg} per window`,
    { stepMs, zoom: (a, b) => setRange(a, b, true) });
  const flagged = series.rows.filter((r) => r.flagged), empty = flagged.filter((r) => r.groups === 0);
  c.querySelector(".range").textContent = (pts.length
    ? `· ${pts.length} windows, ${fmtTime(pts[0].t)}–${fmtTime(pts[pts.length - 1].t)} UTC` : "")
    + (flagged.length ? ` · ${flagged.length} flagged short (shed or lost records)${empty.length ? `, ${empty.length} with no rows` : ""}` : "");
  const partial = latest.rows.some((r) => r.complete === false) ? " · incomplete (hover the hatched rows)" : "";
  c.querySelector(".latest").textContent = latest.window_start
    ? `${fmtTime(Date.parse(latest.window_start), true)}–${fmtTime(Date.parse(latest.window_end), true)} UTC${partial}` : "";
  renderTop(c.querySelector(".top-host"), q, latest);
}

function showError(msg) {
  const e = document.getElementById("error");
  e.textContent = msg || "";
  e.style.display = msg ? "block" : "none";
}

async function refresh() {
  clearTimeout(state.timer);
  try {
    if (!state.queries || !state.rowQueries || Date.now() - state.queriesAt > 60000) {
      const all = await api("/queries");
      state.queries = all.queries;
      state.rowQueries = all.row_queries || [];
      state.queriesAt = Date.now();
    }
    const [st, al] = await Promise.all([
      api("/status").catch((e) => { if (e instanceof AuthError) throw e; return { available: false, error: e.message }; }),
      api("/alerts?limit=20").catch((e) => { if (e instanceof AuthError) throw e; return { error: e.message }; }),
      ...state.queries.map((q) => refreshQuery(q)),
      ...state.rowQueries.map((q) => refreshRowQuery(q)),
    ]);
    renderStatus(st);
    renderAlerts(al);
    showError(null);
    document.getElementById("meta").innerHTML = "";
    document.getElementById("meta").append(`${state.queries.length + state.rowQueries.length} queries · updated `,
      el("b", { text: fmtTime(Date.now(), true) }), ` UTC · refreshes every ${REFRESH_MS / 1000} s`);
  } catch (e) {
    if (e instanceof AuthError) {
      document.getElementById("auth").style.display = "block";
      document.getElementById("meta").textContent = "token required";
      return; // wait for the form
    }
    showError("Could not refresh: " + e.message);
  }
  state.timer = setTimeout(refresh, REFRESH_MS);
}

// #demo_click=N / #demo_drag=a,b (fractions of the plot width): after the first render, send the first
// chart the real mouse events of a click on its N-th bucket or a drag from a to b (headless page tests)
function demoGesture() {
  const click = hashParam("demo_click"), drag = hashParam("demo_drag");
  if (click === null && drag === null) return;
  const s = document.querySelector("svg.chart[data-zoom]");
  if (!s) { setTimeout(demoGesture, 200); return; }
  const r = s.getBoundingClientRect();
  const at = (f, type) => s.dispatchEvent(new MouseEvent(type, { bubbles: true, clientX: r.left + 52 + f * (r.width - 66), clientY: r.top + 60 }));
  if (click !== null) {
    const dots = s.querySelectorAll("[data-bucket]");
    if (dots[Number(click)]) dots[Number(click)].dispatchEvent(new MouseEvent("click", { bubbles: true }));
  } else {
    const [a, b] = drag.split(",").map(Number);
    at(a, "mousedown"); at((a + b) / 2, "mousemove"); at(b, "mousemove"); at(b, "mouseup");
  }
}

initToken();
initRange();
refresh().then(demoGesture);

// ---- live panel: /live/{query} (Server-Sent Events through the API's update queue, read with fetch so
// the bearer token travels in a header). Provisional values of the open window update in place and
// turn final when it closes; a window the queue skipped (all or nothing) disappears.
const LIVE_RATE = Number((/(?:^|[#&])live_rate=(\d+)/.exec(initialHash) || [])[1]) || 20; // updates/s asked for
const live = { query: null, policy: "inplace", rows: new Map(), abort: null, dirty: false, skipped: 0,
               maxS: Number((/(?:^|[#&])live_s=(\d+)/.exec(initialHash) || [])[1]) || 300 };

function liveKey(u) { return u.window_start_us + "|" + JSON.stringify(Object.values(u.group)); }

function liveEvent(ev, data) {
  if (ev === "update") {
    const u = JSON.parse(data);
    live.rows.set(liveKey(u), u);
    const starts = [...new Set([...live.rows.values()].map((r) => r.window_start_us))].sort((a, b) => a - b);
    if (starts.length > 2) for (const [k, r] of live.rows) if (r.window_start_us < starts[starts.length - 2]) live.rows.delete(k);
    live.dirty = true;
  } else if (ev === "skip") {
    const w = JSON.parse(data).window_start_us;
    for (const [k, r] of live.rows) if (r.window_start_us === w) live.rows.delete(k);
    live.skipped += 1;
    live.dirty = true;
  } else if (ev === "stats" || ev === "end") {
    const s = JSON.parse(data);
    document.getElementById("live-stats").textContent =
      `${s.policy} queue · staleness now ${s.staleness_now_s.toFixed(2)} s (avg ${s.staleness_avg_s.toFixed(2)} s) · ` +
      `load factor ${s.load_factor.toFixed(2)} · delivered ${s.delivered} of ${s.offered} · overwrites ${s.overwrites} · ` +
      `skipped windows ${s.skipped_windows}`;
  }
}

function renderLive() {
  if (!live.dirty) return;
  live.dirty = false;
  const host = document.getElementById("live-body");
  const q = (state.queries || []).find((x) => x.name === live.query);
  const rows = [...live.rows.values()];
  if (!q || !rows.length) { host.replaceChildren(el("div", { class: "empty", text: "waiting for live values…" })); return; }
  const newest = Math.max(...rows.map((r) => r.window_start_us));
  const win = rows.filter((r) => r.window_start_us === newest);
  const agg = q.aggregate_columns[0].name;
  win.sort((a, b) => (b.values[agg] ?? -Infinity) - (a.values[agg] ?? -Infinity));
  const allFinal = win.every((r) => r.final);
  const cov = win.reduce((m, r) => Math.min(m, r.hosts_in_mark), Infinity);
  const exp = win.reduce((m, r) => Math.max(m, r.hosts_expected), 0);
  const head = el("div", { class: "sub" },
    el("span", { class: "badge " + (allFinal ? "final" : "provisional"), text: allFinal ? "final" : "open" }), " ",
    `window ${fmtTime(newest / 1000, true)}–${fmtTime(win[0].window_end_us / 1000, true)} UTC · ${win.length} groups`,
    allFinal ? "" : ` · ${cov} of ${exp} capture hosts past it`);
  const gcols = q.key_columns.map((c) => c.name);
  const acols = q.aggregate_columns.map((c) => c.name);
  const table = el("table", {}, el("thead", {}, el("tr", {}, ...gcols.map((c) => el("th", { text: c })),
    ...acols.map((c) => el("th", { class: "num", text: c })), el("th", { text: "state" }))));
  const body = el("tbody");
  for (const r of win.slice(0, TOP_N)) {
    body.append(el("tr", { class: "live-row " + (r.final ? "live-final" : "live-provisional") },
      ...gcols.map((c) => el("td", { class: "key", text: String(r.group[c]) })),
      ...acols.map((c) => el("td", { class: "num", text: r.values[c] === null ? "–" : fmtNum(r.values[c]) })),
      el("td", {}, el("span", { class: "badge " + (r.final ? "final" : "provisional"),
                                text: r.final ? "final" : `provisional ${r.hosts_in_mark}/${r.hosts_expected}` }))));
  }
  table.append(body);
  host.replaceChildren(head, table);
}

async function liveStream() {
  if (live.abort) live.abort.abort();
  const ctl = new AbortController();
  live.abort = ctl;
  live.rows.clear();
  live.dirty = true;
  const headers = { Accept: "text/event-stream" };
  if (state.token) headers.Authorization = "Bearer " + state.token;
  const url = `/live/${encodeURIComponent(live.query)}?policy=${live.policy}&rate=${LIVE_RATE}&max_s=${live.maxS}`;
  try {
    const r = await fetch(url, { headers, cache: "no-store", signal: ctl.signal });
    if (!r.ok) throw new Error(`${url}: ${r.status}`);
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const msg = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let ev = "message", data = "";
        for (const line of msg.split("\n")) {
          if (line.startsWith("event: ")) ev = line.slice(7); else if (line.startsWith("data: ")) data += line.slice(6);
        }
        liveEvent(ev, data);
      }
      renderLive();
    }
  } catch (e) {
    if (ctl.signal.aborted) return;
    document.getElementById("live-stats").textContent = "live stream: " + e.message;
  }
  if (live.abort === ctl) setTimeout(liveStream, 1000); // the stream ends after max_s: reconnect
}

async function initLive() {
  try {
    const st = await api("/live");
    if (!st.enabled) return;
    if (!state.queries) state.queries = (await api("/queries")).queries;
  } catch (e) {
    return; // no live results (or no token yet): the panel stays hidden
  }
  const sel = document.getElementById("live-query");
  sel.replaceChildren(...state.queries.map((q) => el("option", { value: q.name, text: q.name })));
  live.query = state.queries[0].name;
  sel.addEventListener("change", () => { live.query = sel.value; liveStream(); });
  const pol = document.getElementById("live-policy");
  pol.addEventListener("change", () => { live.policy = pol.value; liveStream(); });
  const m = /(?:^|[#&])live_query=([a-z0-9_]+)/.exec(initialHash);
  if (m && state.queries.some((q) => q.name === m[1])) { live.query = m[1]; sel.value = m[1]; }
  document.getElementById("live").style.display = "block";
  liveStream();
}

initLive();

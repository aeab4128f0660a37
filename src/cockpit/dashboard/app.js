// Meridian's dashboard. Reads the admin API of the node that served it and
// follows its event stream (/api/v1/events); draws its charts as SVG, with
// failover drills (/api/v1/drills) as bands on them, and a page per drill
// report (#drill=N). Nothing from the API goes into the DOM as markup: text
// only (textContent, attributes, createElement). The
// admin token lives in sessionStorage (this tab only) and travels as an
// Authorization header, never as a cookie.
"use strict";

const TOKEN_KEY = "meridian-admin-token";
const COLORS = ["#0a58ca", "#e8710a", "#1e8e3e", "#a142f4", "#d01884", "#12b5cb", "#9e6a03", "#5f6368"];
const SVG = "http://www.w3.org/2000/svg";

const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  update: null,
  rule: null,
  key: "",
  keyChosen: false, // the key came from the link or the select, not the default
  history: null, // the selected rule's (or key's) /api/v1/history answer
  versions: [],
  rulesVersion: undefined,
  overview: null, // /api/v1/allocations
  clusterAt: 0,
  drills: [], // /api/v1/drills, newest first
  drillsText: null, // the same as JSON: redraw only on a change
  drill: null, // the drill whose report is shown (#drill=N), or null
  reportText: null, // its report as JSON: redraw only on a change
  tracked: {}, // rule → { keys, at }: keys with tracked demand (the leader's count)
  pods: null, // from /api/v1/leases: { known, byRegion, serverNow }, or null before the first answer
  podsAt: 0,
};

// A pod counts as live when the leader heard it (a report or an
// acknowledgement) this recently. The leases API lists every pod the
// leader still tracks (up to two leases of silence) with when it was last
// heard, not the lease's length: the page draws the line itself and says
// so in the column's header.
const LIVE_POD_MS = 30000;

const $ = (id) => document.getElementById(id);

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

async function api(path, options) {
  const o = Object.assign({}, options || {});
  o.headers = headers(o.headers);
  const response = await fetch(path, o);
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (!response.ok) {
    const reason = body && body.error ? body.error : response.status + " " + response.statusText;
    const error = new Error(reason);
    error.status = response.status;
    throw error;
  }
  return body;
}

// ---- the event stream ------------------------------------------------------

// fetch() rather than EventSource, which cannot send the token header.
async function follow() {
  let backoff = 500;
  for (;;) {
    try {
      const response = await fetch("/api/v1/events", { headers: headers({ Accept: "text/event-stream" }) });
      if (!response.ok) throw new Error("events: " + response.status);
      setConn(true);
      backoff = 500;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
          if (data) onUpdate(JSON.parse(data));
        }
      }
    } catch (e) {
      console.warn("event stream", e);
    }
    setConn(false);
    await new Promise((r) => setTimeout(r, backoff));
    backoff = Math.min(backoff * 2, 5000);
  }
}

function setConn(live) {
  const c = $("conn");
  c.textContent = live ? "live" : "reconnecting…";
  c.className = live ? "live" : "";
}

// Updates are applied one at a time, the newest first once one is done:
// two at once would fetch and append the same samples twice.
let applying = false;
let pending = null;

function onUpdate(u) {
  pending = u;
  if (!applying) drain();
}

async function drain() {
  applying = true;
  while (pending) {
    const u = pending;
    pending = null;
    await applyUpdate(u).catch(showError);
  }
  applying = false;
}

async function applyUpdate(u) {
  const first = state.update === null;
  state.update = u;
  $("node").textContent = "node " + u.node_id + " (" + u.state.toLowerCase() + ")";
  $("node").dataset.epoch = u.epoch;
  $("raft-summary").textContent = "leader " + (u.leader ?? "none") + " · term " + u.term + " · epoch " + u.epoch;
  renderLeases(u);
  if (u.rules_version !== state.rulesVersion) {
    state.rulesVersion = u.rules_version;
    loadVersions().catch(showError);
  }
  if (first || Date.now() - state.clusterAt > 2000) {
    state.clusterAt = Date.now();
    loadCluster().catch(showError);
  }
  if (first || Date.now() - state.podsAt > 2000) loadPods().catch(showError);
  loadLedger().catch(showError);
  // The update does not carry drills: any change may be one (a start, a
  // stop, the epoch a drain publishes), so look again.
  loadDrills().catch(showError);
  await loadOverview().catch(showError);
  if (state.rule) await loadHistory(true).catch(showError);
}

function showError(e) {
  const r = $("action-result");
  if (e && e.status === 401) {
    r.textContent = "This node needs a token to read: enter the admin (or read) token above.";
  } else {
    console.warn(e);
  }
}

// ---- global rules -----------------------------------------------------------

async function loadOverview() {
  const u = state.update;
  // Hits are counted by the leader only: a follower asks it (relayed).
  const path = "/api/v1/allocations" + (u && u.hits_counted_here ? "" : "?consistent=true");
  let overview;
  try {
    overview = await api(path);
    $("hits-note").textContent = u && u.hits_counted_here
      ? "Admitted and rejected: hits this node counted from the regions' reports since it began leading."
      : "Admitted and rejected are counted by the leader: this follower shows the leader's counts.";
  } catch (e) {
    overview = await api("/api/v1/allocations");
    $("hits-note").textContent = "Admitted and rejected are counted by the leader, which cannot be reached: " + e.message;
  }
  state.overview = overview;
  const tbody = $("rules-table").tBodies[0];
  tbody.replaceChildren();
  const ids = Object.keys(overview.rules || {});
  for (const id of ids) {
    const r = overview.rules[id];
    const meta = (state.update && state.update.rules && state.update.rules[id]) || null;
    const demand = Object.values(r.demand || {}).reduce((a, b) => a + b, 0);
    const hits = Object.values(r.hits || {});
    const asked = hits.reduce((a, h) => a + h.asked, 0);
    const allowed = hits.reduce((a, h) => a + h.allowed, 0);
    const tr = row([id, fmt(r.limit), meta ? meta.algorithm : "", meta ? meta.partition : "",
      fmt(overview.epoch), fmt(Math.round(demand)), hits.length ? fmt(allowed) : "—",
      hits.length ? fmt(asked - allowed) : "—"], [1, 4, 5, 6, 7]);
    tr.dataset.rule = id;
    tbody.append(tr);
  }
  const select = $("rule-select");
  if (select.options.length !== ids.length || ids.some((id, i) => select.options[i].value !== id)) {
    select.replaceChildren(...ids.map((id) => new Option(id, id)));
    if (!ids.includes(state.rule)) {
      // A rule the link named that is gone: its key goes with it.
      if (state.rule !== null) {
        state.key = "";
        state.keyChosen = false;
      }
      state.rule = ids[0] || null;
      state.history = null;
    }
    select.value = state.rule || "";
    if (state.rule && !state.history) await loadHistory(false);
  }
}

// ---- history and charts -------------------------------------------------------

async function loadHistory(incremental) {
  const h = state.history;
  const sameSeries = h && h.rule === state.rule && (h.key || "") === state.key;
  let path = "/api/v1/history?rule=" + encodeURIComponent(state.rule);
  if (state.key) path += "&key=" + encodeURIComponent(state.key);
  const last = sameSeries && incremental && h.samples.length ? h.samples[h.samples.length - 1].at_unix_ms : null;
  if (last !== null) path += "&since=" + last;
  const answer = await api(path);
  // A rule whose keys have entries of their own opens on the busiest: each
  // key has its own L, and only a key's figures compare with it.
  if (!state.keyChosen && !state.key && (answer.keys_with_series || []).length) {
    state.key = answer.keys_with_series[0];
    return loadHistory(false);
  }
  writeHash();
  if (last !== null && sameSeries && sameRegions(h.regions, answer.regions)) {
    const newest = h.samples[h.samples.length - 1].epoch;
    h.samples = h.samples.concat(answer.samples.filter((x) => x.epoch > newest)).slice(-answer.capacity);
    Object.assign(h, answer, { samples: h.samples });
  } else {
    state.history = answer;
  }
  renderKeys();
  renderCharts();
  if (state.history.source === "rule_split") loadTracked(state.rule).catch(showError);
}

// How many keys the leader tracks demand of for `rule`, at most every 5 s:
// the split's admitted counts are all keys' together, which only one key's
// L bounds when there is one key. Key entries (and their series) come and
// go as keys' splits part from the rule's, so they cannot tell.
async function loadTracked(rule) {
  const known = state.tracked[rule];
  if (known && Date.now() - known.at < 5000) return;
  state.tracked[rule] = { keys: known ? known.keys : null, at: Date.now() };
  const u = state.update;
  const leading = Boolean(u && u.hits_counted_here);
  const a = await api("/api/v1/allocations?rule=" + encodeURIComponent(rule) + "&history=0" + (leading ? "" : "&consistent=true"));
  // Only the leader tracks demand: a follower's own count is no answer.
  const keys = leading || a.consistency === "linearizable" ? a.tracked_keys : null;
  const changed = !known || known.keys !== keys;
  state.tracked[rule] = { keys: typeof keys === "number" ? keys : null, at: Date.now() };
  if (changed && state.history && state.history.rule === rule && state.history.source === "rule_split") renderCharts();
}

// True when the split's counts are of several keys, each with its own L.
function severalKeys(h) {
  const t = state.tracked[h.rule];
  if (t && t.keys !== null) return t.keys > 1;
  return (h.keys_with_series || []).length > 0;
}

function sameRegions(a, b) {
  return a.length === b.length && a.every((r, i) => r === b[i]);
}

// `#rule=R&key=K` opens a rule and key (`key=` the rule's split), and
// `#drill=N` drill N's report; the page keeps the hash in step, so a view
// can be shared as a link.
function readHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (p.has("rule")) state.rule = p.get("rule");
  if (p.has("key")) {
    state.key = p.get("key");
    state.keyChosen = true;
  }
  state.drill = drillParam(p);
}

function drillParam(p) {
  const v = p.get("drill");
  return v !== null && /^[0-9]{1,15}$/.test(v) ? Number(v) : null;
}

function hashFor(drill) {
  const p = new URLSearchParams();
  if (state.rule) p.set("rule", state.rule);
  if (state.keyChosen) p.set("key", state.key);
  if (drill !== null) p.set("drill", String(drill));
  return "#" + p.toString();
}

function writeHash() {
  history.replaceState(null, "", hashFor(state.drill));
  $("drill-back").href = hashFor(null);
}

// A link, the address bar or Back changed the hash. Fragments that name
// none of the page's parameters (the skip link's `#main`) change nothing.
function onHashChange() {
  const p = new URLSearchParams(location.hash.slice(1));
  if (location.hash.length > 1 && !["rule", "key", "drill"].some((k) => p.has(k))) return;
  let series = false;
  if (p.has("rule") && p.get("rule") !== state.rule) {
    state.rule = p.get("rule");
    state.key = "";
    state.keyChosen = false;
    series = true;
  }
  if (p.has("key") && (p.get("key") !== state.key || !state.keyChosen)) {
    state.key = p.get("key");
    state.keyChosen = true;
    series = true;
  }
  const was = state.drill;
  state.drill = drillParam(p);
  writeHash();
  if (series && state.rule) {
    state.history = null;
    $("rule-select").value = state.rule;
    loadHistory(false).catch(showError);
  }
  if (state.drill !== was) showView(true, was);
}

function renderKeys() {
  const h = state.history;
  const select = $("key-select");
  const keys = h.keys_with_series || [];
  const wanted = [""].concat(keys);
  if (select.options.length !== wanted.length || wanted.some((k, i) => select.options[i].value !== k)) {
    select.replaceChildren(new Option("(the rule's split)", ""), ...keys.map((k) => new Option(k, k)));
    select.value = keys.includes(state.key) ? state.key : "";
  }
}

function renderCharts() {
  const h = state.history;
  if (!h) return;
  const samples = h.samples;
  const regions = h.regions;
  const times = samples.map((s) => s.at_unix_ms);
  // While a drill acts, the time axis runs to now: the last epoch's grants
  // hold until the next, and the drill's band reaches the present.
  const now = Date.now();
  const tEnd = times.length ? Math.max(times[times.length - 1], state.drills.some((d) => d.active) ? now : 0) : null;
  const bands = times.length ? drillBands(times[0], tEnd, now) : [];
  const drillCol = bands.length ? ["Drill"] : [];
  const drillCell = (t) => bands.length ? [drillsAt(t, now)] : [];
  const L = samples.length ? samples[samples.length - 1].limit : h.limit;
  $("alloc-caption").textContent = "Each region's allocation of " + h.rule + (h.key ? " for key " + h.key : "") +
    " (stacked) against L = " + fmt(L) + (h.source === "rule_split" && h.key ? " (this key has no entry: it uses the split)" : "");
  // 1. stacked allocation
  const series = regions.map((name, r) => ({ name, values: samples.map((s) => s.granted[r] ?? 0) }));
  stacked($("chart-alloc"), times, series, [{ y: L, label: "L " + fmt(L) }], tEnd, bands);
  table($("table-alloc"), ["Epoch", "Time (UTC)"].concat(regions).concat(["L"]).concat(drillCol),
    samples.slice(-30).reverse().map((s) => [s.epoch, time(s.at_unix_ms)].concat(regions.map((_, r) => s.granted[r] ?? "—")).concat([s.limit]).concat(drillCell(s.at_unix_ms))), [regions.length + 3]);
  // 2. per region, last sample
  const last = samples[samples.length - 1];
  const groups = ["demand", "allocation", "admitted", "rejected"];
  const bars = regions.map((name, r) => ({
    name,
    values: last ? [last.demand[r] ?? 0, last.granted[r] ?? 0,
      last.admitted_in_period ? last.admitted_in_period[r] : null,
      last.rejected_in_period ? last.rejected_in_period[r] : null] : [],
  }));
  grouped($("chart-regions"), groups, bars);
  table($("table-regions"), ["Region"].concat(groups), bars.map((b) => [b.name].concat(b.values.map((v) => v === null ? "not counted here" : fmt(v)))));
  // 3. world-wide admitted per period
  const world = samples.map((s) => s.admitted_in_period ? s.admitted_in_period.reduce((a, b) => a + b, 0) : null);
  // A key without an entry of its own is served the split's series: its
  // demand and use are the rule's, all keys together, not the key's.
  const perKey = Boolean(h.key) && h.source !== "rule_split";
  const borrowed = h.key && !perKey ? "key " + h.key + " has no entry of its own: these are the rule's figures" : "";
  const several = !perKey && severalKeys(h);
  const lines = several ? [] : [{ y: L, label: "L " + fmt(L) }];
  let bound = "the stated bound is L";
  if (h.partition === "available" && lines.length) {
    const largest = last ? Math.max(0, ...last.granted.map((g) => g ?? 0)) : 0;
    lines.push({ y: L + largest, label: "L + a silent region's allocation", dashed: true });
    bound = "partition: available — while a region is cut off, at most L + its allocation for one lease";
  }
  if (h.accuracy === "approximate") bound += "; approximate: + pods × max_batch per region (a limiter setting, not drawn)";
  $("world-caption").textContent = lines.length
    ? "World-wide admitted per " + period(h.period_ms) + (perKey ? " for key " + h.key : "") + " against L (" + bound + ")" + (borrowed ? "; " + borrowed : "")
    : "World-wide admitted per " + period(h.period_ms) + ", all keys together (each key has its own L = " + fmt(L) +
      (borrowed ? "; " + borrowed : ": pick a key to see it against L") + ")";
  $("regions-caption").textContent = !several
    ? "Per region, last " + period(h.period_ms) + ": demand, allocation, admitted, rejected" + (perKey ? " for key " + h.key : "") + (borrowed ? " (" + borrowed + ")" : "")
    : "Per region, last " + period(h.period_ms) + ": demand, admitted and rejected of all keys together" + (borrowed ? " (" + borrowed + ")" : "") +
      "; allocation is what each key without an entry of its own may use";
  line($("chart-world"), times, world, lines, tEnd, bands);
  table($("table-world"), ["Epoch", "Time (UTC)", "Admitted in the period before", "L"].concat(drillCol),
    samples.slice(-30).reverse().map((s, i) => [s.epoch, time(s.at_unix_ms), world[samples.length - 1 - i] ?? "not counted", s.limit].concat(drillCell(s.at_unix_ms))), [4]);
  $("use-note").textContent = h.use_counted
    ? "Served by node " + h.node_id + " (the leader). Grants and demand are sampled at each epoch on every node; admitted and rejected come from the regions' reports to the leader."
    : "Admitted and rejected are not shown: " + (h.use_note || "not counted on this node") + ".";
}

function el(name, attrs, parent) {
  const e = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.append(e);
  return e;
}

function frame(container, label, bands) {
  // role="img" hides the children from assistive technology: the label
  // names the drills the bands show.
  if (bands && bands.length) label += ". Drills: " + bands.map((b) => bandText(b.drill)).join("; ");
  const svg = el("svg", { viewBox: "0 0 900 240", role: "img", "aria-label": label });
  container.replaceChildren(svg);
  return svg;
}

const PAD = { l: 60, r: 170, t: 10, b: 24 };

function axes(svg, t0, t1, yMax) {
  const w = 900 - PAD.l - PAD.r, h = 240 - PAD.t - PAD.b;
  for (let i = 0; i <= 4; i++) {
    const y = PAD.t + h - (h * i) / 4;
    el("line", { x1: PAD.l, x2: PAD.l + w, y1: y, y2: y, stroke: "#eaeef2" }, svg);
    el("text", { x: PAD.l - 6, y: y + 4, "text-anchor": "end" }, svg).textContent = fmt(Math.round((yMax * i) / 4));
  }
  if (t0 !== null) {
    el("text", { x: PAD.l, y: 236 }, svg).textContent = time(t0);
    el("text", { x: PAD.l + w, y: 236, "text-anchor": "end" }, svg).textContent = time(t1);
  }
  return {
    x: (t) => PAD.l + (t1 === t0 ? w : ((t - t0) / (t1 - t0)) * w),
    y: (v) => PAD.t + h - (yMax ? (v / yMax) * h : 0),
    w, h,
  };
}

function refLines(svg, s, lines) {
  for (const l of lines) {
    const y = s.y(l.y);
    el("line", { x1: PAD.l, x2: PAD.l + s.w, y1: y, y2: y, stroke: "#b42318", "stroke-width": 1.5, "stroke-dasharray": l.dashed ? "6 4" : "", class: "ref", "data-value": l.y }, svg);
    el("text", { x: PAD.l + s.w + 6, y: y + 4, fill: "#b42318" }, svg).textContent = l.label;
  }
}

function legend(svg, names, y0) {
  names.forEach((name, i) => {
    const y = (y0 || 30) + i * 16;
    el("rect", { x: 900 - PAD.r + 90, y: y - 9, width: 10, height: 10, fill: COLORS[i % COLORS.length] }, svg);
    el("text", { x: 900 - PAD.r + 104, y }, svg).textContent = name;
  });
}

function stacked(container, times, series, lines, tEnd, bands) {
  const total = times.map((_, i) => series.reduce((a, s) => a + s.values[i], 0));
  const yMax = Math.max(1, ...total, ...lines.map((l) => l.y)) * 1.05;
  const svg = frame(container, "Allocation per region over time, stacked, against L", bands);
  svg.setAttribute("data-samples", times.length);
  if (!times.length) return;
  const s = axes(svg, times[0], tEnd, yMax);
  const base = times.map(() => 0);
  series.forEach((ser, k) => {
    const top = base.map((b, i) => b + ser.values[i]);
    // Steps: a grant holds until the next epoch changes it.
    const step = (vals) => times.flatMap((t, i) => {
      const next = i + 1 < times.length ? times[i + 1] : tEnd;
      return [s.x(t) + "," + s.y(vals[i]), s.x(next) + "," + s.y(vals[i])];
    });
    const pts = step(top);
    const back = step(base).reverse();
    el("polygon", {
      points: pts.concat(back).join(" "), fill: COLORS[k % COLORS.length], "fill-opacity": 0.75,
      class: "area", "data-region": ser.name, "data-last": ser.values[ser.values.length - 1],
    }, svg);
    top.forEach((v, i) => { base[i] = v; });
  });
  drawBands(svg, s, bands);
  refLines(svg, s, lines);
  legend(svg, series.map((x) => x.name));
}

function grouped(container, groups, bars) {
  const svg = frame(container, "Demand, allocation, admitted and rejected per region in the last period");
  const values = bars.flatMap((b) => b.values.filter((v) => v !== null));
  const yMax = Math.max(1, ...values) * 1.05;
  const s = axes(svg, null, null, yMax);
  const slot = s.w / Math.max(1, bars.length);
  const width = (slot * 0.8) / groups.length;
  bars.forEach((b, r) => {
    b.values.forEach((v, g) => {
      if (v === null) return;
      const x = PAD.l + r * slot + slot * 0.1 + g * width;
      el("rect", { x, y: s.y(v), width: width - 2, height: Math.max(0, s.y(0) - s.y(v)), fill: COLORS[g], class: "bar", "data-region": b.name, "data-kind": groups[g], "data-value": v }, svg);
    });
    el("text", { x: PAD.l + r * slot + slot / 2, y: 236, "text-anchor": "middle" }, svg).textContent = b.name;
  });
  legend(svg, groups);
}

function line(container, times, values, lines, tEnd, bands) {
  const known = values.filter((v) => v !== null);
  const yMax = Math.max(1, ...known, ...lines.map((l) => l.y)) * 1.05;
  const svg = frame(container, "World-wide admitted per period against L", bands);
  if (!times.length) return;
  const s = axes(svg, times[0], tEnd, yMax);
  drawBands(svg, s, bands);
  let d = "";
  values.forEach((v, i) => {
    if (v === null) return;
    d += (d && values[i - 1] !== null ? " L" : " M") + s.x(times[i]) + "," + s.y(v);
  });
  if (d) el("path", { d, fill: "none", stroke: COLORS[0], "stroke-width": 2, class: "admitted", "data-max": Math.max(0, ...known) }, svg);
  refLines(svg, s, lines);
  legend(svg, ["admitted"]);
}

// Each drill the chart's time range [t0, t1] overlaps, clipped to it: from
// its start to its stop, or now while it acts.
function drillBands(t0, t1, now) {
  if (t1 === null || t1 <= t0) return [];
  return state.drills
    .map((d) => ({ drill: d, from: Math.max(t0, d.started_at_unix_ms), to: Math.min(t1, drillEnd(d, now)) }))
    .filter((b) => b.from < b.to)
    .sort((a, b) => a.drill.id - b.drill.id);
}

function drillEnd(d, now) {
  return d.stopped ? d.stopped.at_unix_ms : Math.max(now, d.started_at_unix_ms);
}

function drawBands(svg, s, bands) {
  (bands || []).forEach((b, i) => {
    const d = b.drill;
    const st = drillState(d);
    const x0 = s.x(b.from), x1 = s.x(b.to);
    const g = el("g", { class: "drill", "data-drill": d.id, "data-state": st }, svg);
    el("title", {}, g).textContent = bandText(d);
    el("rect", { x: x0, y: PAD.t, width: Math.max(2, x1 - x0), height: s.h, class: "drill-band" }, g);
    const label = "drill " + d.id + ": " + d.mode + " " + d.region;
    // Near the right edge the label ends at the band's end instead.
    const flip = x0 + 6 + label.length * 6.2 > PAD.l + s.w && x1 - PAD.l > label.length * 6.2;
    el("text", { x: flip ? x1 - 4 : x0 + 4, y: PAD.t + 12 + (i % 3) * 13, "text-anchor": flip ? "end" : "start", class: "drill-label" }, g)
      .textContent = label;
  });
}

// "drill 1 (drain of mumbai) from 12:00:00 to 12:01:00 UTC" — the bands'
// titles, the charts' labels.
function bandText(d) {
  return "drill " + d.id + " (" + d.mode + " of " + d.region + ") from " + time(d.started_at_unix_ms) +
    (d.stopped ? " to " + time(d.stopped.at_unix_ms) + " UTC" : " UTC, active now");
}

// The drills acting at `t`, for the charts' tables.
function drillsAt(t, now) {
  const at = state.drills.filter((d) => d.started_at_unix_ms <= t && t <= drillEnd(d, now));
  return at.length ? at.map((d) => "drill " + d.id + " (" + d.mode + " " + d.region + ")").join(", ") : "—";
}

// ---- drills -----------------------------------------------------------------------

// Loads are one at a time; a request during one makes it look once more.
let drillsBusy = false;
let drillsAgain = false;
let drillsTimer = null;

async function loadDrills() {
  if (drillsBusy) {
    drillsAgain = true;
    return;
  }
  drillsBusy = true;
  try {
    do {
      drillsAgain = false;
      const answer = await api("/api/v1/drills");
      const drills = answer.drills || [];
      const text = JSON.stringify(drills);
      const changed = text !== state.drillsText;
      state.drills = drills;
      state.drillsText = text;
      if (changed) renderDrills();
      // An active drill's band grows with the clock.
      if (changed || drills.some((d) => d.active)) renderCharts();
      if (state.drill !== null) {
        const shown = JSON.parse(state.reportText || "null");
        if (changed || !shown || !shown.report.complete) await loadReport();
      }
    } while (drillsAgain);
  } finally {
    drillsBusy = false;
    // Every 2 s while a drill acts or is observed, else every 10 s (the
    // event stream may say nothing of a drill that moves no allocation).
    clearTimeout(drillsTimer);
    const busy = state.drills.some((d) => !d.finished);
    drillsTimer = setTimeout(() => loadDrills().catch(showError), busy ? 2000 : 10000);
  }
}

function drillState(d) {
  if (d.active) return "active";
  return d.finished ? "finished" : "recovering";
}

function actor(a, withAddress) {
  if (!a) return "—";
  return a.credential + (withAddress && a.from ? " from " + a.from : "") +
    (a.operator ? " (operator " + a.operator + ")" : "");
}

function renderDrills() {
  const tbody = $("drills-table").tBodies[0];
  // A focused report link keeps the focus through the redraw.
  const focused = tbody.contains(document.activeElement) ? document.activeElement.dataset.drill : undefined;
  if (!state.drills.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 8;
    td.className = "note";
    td.textContent = "No drills recorded.";
    tr.append(td);
    tbody.replaceChildren(tr);
    return;
  }
  tbody.replaceChildren(...state.drills.map((d) => {
    const st = drillState(d);
    const stopped = d.stopped
      ? dateTime(d.stopped.at_unix_ms) + " by " + actor(d.stopped.by) + (d.stopped.reason === "duration_elapsed" ? " (its duration ran out)" : "")
      : d.ends_at_unix_ms ? "not yet; ends at " + dateTime(d.ends_at_unix_ms) : "not yet";
    const tr = row([d.id, d.region, d.mode, st + (d.forced ? " (forced)" : ""), dateTime(d.started_at_unix_ms), actor(d.started_by), stopped], [0]);
    tr.dataset.drill = d.id;
    tr.dataset.state = st;
    tr.cells[3].classList.add("state-" + st);
    const td = document.createElement("td");
    const a = document.createElement("a");
    a.href = "#drill=" + d.id;
    a.dataset.drill = d.id;
    a.textContent = "Report of drill " + d.id;
    td.append(a);
    tr.append(td);
    return tr;
  }));
  if (focused !== undefined) {
    const link = tbody.querySelector('a[data-drill="' + focused + '"]');
    if (link) link.focus();
  }
}

// Shows the overview or drill `state.drill`'s report. `moved`: the reader
// navigated (focus follows); `from`: the drill shown before.
function showView(moved, from) {
  const report = state.drill !== null;
  for (const section of $("main").children) section.hidden = (section.id === "drill-page") !== report;
  document.title = report ? "Drill " + state.drill + " · Meridian" : "Meridian";
  if (report) {
    state.reportText = null;
    $("drill-h").textContent = "Drill " + state.drill;
    $("drill-status").textContent = "Loading drill " + state.drill + "…";
    $("drill-status").className = "";
    $("drill-body").replaceChildren();
    if (moved) $("drill-h").focus();
    loadReport().catch(showError);
  } else if (moved && from !== null && from !== undefined) {
    const link = document.querySelector('#drills-table a[data-drill="' + from + '"]');
    if (link) link.focus();
  }
}

async function loadReport() {
  const id = state.drill;
  let answer;
  try {
    answer = await api("/api/v1/drills/" + id);
  } catch (e) {
    if (state.drill !== id) return;
    $("drill-status").textContent = e.status === 404
      ? "Drill " + id + " does not exist (or is no longer kept: the oldest finished drills are dropped)."
      : "The report could not be read: " + e.message;
    $("drill-status").className = "error";
    state.reportText = null;
    $("drill-body").replaceChildren();
    if (e.status !== 404) throw e;
    return;
  }
  if (state.drill !== id) return; // the reader moved on meanwhile
  const text = JSON.stringify({ report: answer.report, drill: answer.drill, markdown: answer.markdown });
  if (text === state.reportText) return;
  state.reportText = text;
  renderReport(answer);
}

function renderReport(answer) {
  const r = answer.report;
  const d = answer.drill;
  const body = $("drill-body");
  const md = body.querySelector("details");
  const mdOpen = md ? md.open : false;
  $("drill-h").textContent = "Drill " + r.id + ": " + r.mode + " " + r.region + (r.complete ? "" : " (in progress)");
  $("drill-status").textContent = "";
  $("drill-status").className = "";
  const parts = [];

  // Who did what, when.
  const facts = document.createElement("dl");
  facts.id = "drill-facts";
  facts.className = "facts";
  const fact = (name, value, id) => {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value;
    if (id) dd.id = id;
    facts.append(dt, dd);
  };
  fact("Mode", r.mode, "drill-mode");
  fact("Region", r.region, "drill-region");
  fact("Note", r.note || "(none)", "drill-note");
  fact("State", drillState(d) + (r.forced ? " (started with force)" : ""));
  fact("Started", dateTime(r.started_at_unix_ms) + " UTC by " + actor(r.started_by, true));
  if (r.stopped) {
    fact("Stopped", dateTime(r.stopped.at_unix_ms) + " UTC (" + seconds(r.stopped.at_unix_ms - r.started_at_unix_ms, 1) + ") by " +
      actor(r.stopped.by, true) + (r.stopped.reason === "duration_elapsed" ? ": its duration ran out" : ""));
  } else {
    fact("Stopped", d.ends_at_unix_ms ? "not yet: ends by itself at " + dateTime(d.ends_at_unix_ms) + " UTC" : "not yet: runs until stopped");
  }
  if ((r.observed_by || []).length) fact("Observed by", "coordinator " + r.observed_by.join(", then "));
  fact("Report", r.complete ? "complete: observation ended" : "in progress: it changes while the drill is observed");
  parts.push(facts);

  // The figures, each with how it was measured.
  parts.push(heading("Figures"));
  const f = r.figures;
  const figures = document.createElement("dl");
  figures.id = "drill-figures";
  figures.className = "figures";
  const figure = (name, value, how) => {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value;
    const note = document.createElement("dd");
    note.className = "note how";
    note.textContent = how;
    figures.append(dt, dd, note);
  };
  const ms = (v) => v === null || v === undefined ? "not reached" : fmt(v) + " ms";
  figure("Time until the other regions covered the shifted demand", ms(f.covered_after_ms.value), f.covered_after_ms.how);
  const w = f.worst_window.value;
  figure("Largest window", w
    ? fmt(w.total) + " admitted world-wide in " + w.rule + "'s window at " + time(w.start_ms) + " UTC against L = " + fmt(w.limit) +
      " (bound " + fmt(w.bound) + "): " + signed(w.over_limit) + " over L, " + signed(w.over_bound) + " over the bound"
    : "no counted window ended during the drill", f.worst_window.how);
  const x = f.rejections.value;
  figure("Rejected because of the drill", x
    ? fmt(x.because_of_drill) + " (rejected " + fmt(x.rejected) + " of " + fmt(x.asked) + " asked; " +
      (x.rejected_before === null ? "no rate seen" : fmt(x.rejected_before * 100) + " % rejected") + " before the drill)"
    : "no reports counted", f.rejections.how);
  figure("Time to recover", ms(f.recovered_after_ms.value), f.recovered_after_ms.how);
  parts.push(figures);

  // Every counted window: each region's figure, the total against L and
  // the bound.
  parts.push(heading("Windows"));
  if (f.windows.length) {
    const regions = [...new Set(f.windows.flatMap((x) => Object.keys(x.admitted)))].sort();
    const t = document.createElement("table");
    t.id = "drill-windows";
    const rows = f.windows.map((x) => [x.rule, time(x.start_ms)]
      .concat(regions.map((g) => g in x.admitted ? fmt(x.admitted[g]) + ((x.estimated || []).includes(g) ? " (est.)" : "") : "—"))
      .concat([fmt(x.total) + (x.total > x.bound ? " — over the bound by " + fmt(x.total - x.bound) : ""), fmt(x.limit), fmt(x.bound)]));
    table(t, ["Rule", "Window start (UTC)"].concat(regions).concat(["Total", "L", "Bound"]), rows);
    f.windows.forEach((x, i) => {
      if (x.total > x.bound) {
        const tr = t.tBodies[0].rows[i];
        tr.classList.add("over");
        tr.dataset.over = "true";
      }
    });
    const caption = document.createElement("caption");
    caption.textContent = "World-wide admitted per counted window; (est.): the region was not heard, counted at what it could enforce";
    t.prepend(caption);
    parts.push(t);
  } else {
    parts.push(para("No counted window yet (windows are counted for exact fixed-window rules only).", "note"));
  }

  // The timeline.
  parts.push(heading("Timeline"));
  const tl = document.createElement("table");
  tl.id = "drill-timeline";
  table(tl, ["Offset", "Time (UTC)", "What"], r.timeline.map((l) => [seconds(l.offset_ms, 3), time(l.at_unix_ms), l.what]), [2]);
  parts.push(tl);
  if (r.dropped_events > 0) parts.push(para(fmt(r.dropped_events) + " events beyond the record's bound were dropped.", "note"));

  // The same report as markdown, to paste into an incident document.
  const details = document.createElement("details");
  details.open = mdOpen;
  const summary = document.createElement("summary");
  summary.id = "drill-markdown-summary";
  summary.textContent = "The report as markdown";
  const pre = document.createElement("pre");
  pre.className = "markdown";
  pre.textContent = answer.markdown || "";
  details.append(summary, pre);
  parts.push(details);
  body.replaceChildren(...parts);
}

function heading(text) {
  const h = document.createElement("h3");
  h.textContent = text;
  return h;
}

function para(text, className) {
  const p = document.createElement("p");
  p.textContent = text;
  if (className) p.className = className;
  return p;
}

function seconds(ms, digits) {
  return (ms < 0 ? "−" : "+") + (Math.abs(ms) / 1000).toFixed(digits) + " s";
}

function signed(n) {
  return (n > 0 ? "+" : n < 0 ? "−" : "±") + fmt(Math.abs(n));
}

// ---- regions, Raft, versions ----------------------------------------------------

function renderLeases(u) {
  const tbody = $("regions-table").tBodies[0];
  tbody.replaceChildren();
  const now = Date.now();
  for (const [name, l] of Object.entries(u.leases || {})) {
    const valid = l.valid_until_unix_ms >= now;
    const live = livePods(name);
    const tr = row([name, l.state || "not registered", valid ? "valid" : "lapsed",
      Math.round((l.valid_until_unix_ms - now) / 100) / 10 + " s", fmt(l.acked_epoch), live === null ? "—" : fmt(live),
      l.last_heard_unix_ms ? time(l.last_heard_unix_ms) : "never"], [3, 4, 5]);
    tr.dataset.region = name;
    tr.cells[5].classList.add("pods");
    if (live !== null) tr.cells[5].dataset.pods = live;
    tbody.append(tr);
  }
}

// The region's pods heard within LIVE_POD_MS, or null where this page does
// not know (pods are known to the leader only).
function livePods(region) {
  const p = state.pods;
  if (!p || !p.known) return null;
  return (p.byRegion[region] || []).filter((x) => x.last_heard_unix_ms >= p.serverNow - LIVE_POD_MS).length;
}

// Pods are heard by the leader only: a follower asks it (relayed, as for
// the hits); when it cannot, the column says it does not know.
async function loadPods() {
  state.podsAt = Date.now();
  const u = state.update;
  const leading = Boolean(u && u.hits_counted_here);
  let answer;
  let note;
  try {
    answer = await api("/api/v1/leases" + (leading ? "" : "?consistent=true"));
    note = leading
      ? "Live pods: the pods of each region this node (the leader) heard from in the last 30 s, by report or acknowledgement."
      : "Live pods are known to the leader only: this follower shows the leader's figures (pods it heard from in the last 30 s).";
  } catch (e) {
    if (e.status === 401) throw e;
    note = "Live pods are known to the leader only, which cannot be reached: " + e.message;
    answer = await api("/api/v1/leases").catch(() => ({ consistency: "local", regions: [] }));
  }
  // The answer is the leader's when it was served as a consistent read
  // (the leader itself, or relayed to it), or when this node leads.
  const known = leading || answer.consistency === "linearizable";
  const byRegion = {};
  let serverNow = Date.now();
  for (const r of answer.regions || []) {
    byRegion[r.region] = r.pods || [];
    // The server's clock, not this browser's: last heard is the leader's time.
    if (typeof r.valid_until_unix_ms === "number" && typeof r.expires_in_ms === "number") serverNow = r.valid_until_unix_ms - r.expires_in_ms;
  }
  state.pods = { known, byRegion, serverNow };
  $("pods-note").textContent = note;
  renderReportInterval(known ? answer.report_interval : null);
  if (state.update) renderLeases(state.update);
}

// A warning line when some pods report less often than the coordinators
// ask (an old limiter, or a long --report-interval): their regions' demand
// goes stale between reports. The leader's figures only (see /readyz).
function renderReportInterval(r) {
  const line = $("report-interval-note");
  const slow = (r && r.mismatched_pods) || [];
  line.hidden = slow.length === 0;
  if (!slow.length) return;
  const regions = [...new Set(slow.map((p) => p.region))].sort();
  const worst = Math.max(...slow.map((p) => p.interval_ms));
  const s = (ms) => (ms / 1000).toFixed(1).replace(/\.0$/, "") + " s";
  line.textContent = "Report interval mismatch: " + slow.length + " pod" + (slow.length === 1 ? "" : "s") +
    " in " + regions.join(", ") + " report every " + s(worst) + " (longest) against the " +
    s(r.expected_ms) + " the coordinators give; allocations for " + (regions.length === 1 ? "that region" : "those regions") +
    " follow stale demand. Upgrade those limiters or drop their --report-interval (GET /readyz lists them).";
}

async function loadCluster() {
  const c = await api("/api/v1/cluster");
  $("raft-line").textContent = "This node: " + c.node_id + " (" + c.state + "), leader " + (c.leader ?? "none") +
    ", term " + c.term + ", commit index " + c.commit_index + ", applied index " + c.applied_index +
    (c.leader === c.node_id ? "" : " — match indexes are known to the leader only");
  const tbody = $("raft-table").tBodies[0];
  tbody.replaceChildren();
  for (const n of c.nodes) {
    const lag = n.match_index === null ? "—" : fmt(Math.max(0, c.last_log_index - n.match_index));
    tbody.append(row([n.id, n.role, n.http_addr, n.match_index ?? "—", lag, n.last_contact_ms === null ? "—" : n.last_contact_ms + " ms"], [3, 4, 5]));
  }
}

async function loadVersions() {
  const v = await api("/api/v1/rules/versions");
  state.versions = v.versions;
  const tbody = $("versions-table").tBodies[0];
  tbody.replaceChildren();
  for (const x of v.versions.slice().reverse()) {
    const stage = x.stage + (x.canary_regions.length ? " (" + x.canary_regions.join(", ") + ")" : "");
    const origin = x.origin.kind === "rollback" ? "rollback to " + x.origin.of : "put";
    const tr = row([x.number, stage, origin, time(x.created_at_unix_ms), x.file_names.join(", ")], [0]);
    tr.dataset.version = x.number;
    tbody.append(tr);
  }
  const numbers = v.versions.map((x) => x.number).reverse();
  for (const [id, pick] of [["diff-from", 1], ["diff-to", 0]]) {
    const s = $(id);
    const keep = s.value;
    s.replaceChildren(...numbers.map((n) => new Option(String(n), String(n))));
    s.value = numbers.includes(Number(keep)) ? keep : String(numbers[Math.min(pick, numbers.length - 1)] ?? "");
  }
  const back = $("rollback-to");
  const keep = back.value;
  back.replaceChildren(new Option("the previous stable version", ""), ...numbers.slice(1).map((n) => new Option("version " + n, String(n))));
  back.value = keep;
}

async function showDiff() {
  const from = $("diff-from").value, to = $("diff-to").value;
  try {
    const d = await api("/api/v1/rules/diff?from=" + from + "&to=" + to);
    $("diff").textContent = d.diff || "(versions " + from + " and " + to + " have the same files)";
  } catch (e) {
    $("diff").textContent = "diff: " + e.message;
  }
}

async function act(what, path, body) {
  const result = $("action-result");
  if (!state.token) {
    result.textContent = what + " needs the admin token: enter it above and choose “Use token”.";
    result.className = "error";
    $("token").focus();
    return;
  }
  result.textContent = what + "…";
  result.className = "";
  try {
    const r = await api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    result.textContent = what + " done: version " + (r.version ?? "?") + " (log index " + (r.log_index ?? "?") + ").";
    await loadVersions();
  } catch (e) {
    result.textContent = what + " refused: " + e.message + (e.status === 401 ? " — check the token." : "");
    result.className = "error";
  }
}

// ---- the world ledger -----------------------------------------------------------

// /api/v1/ledger: per global rule, the busiest key's world-wide admitted
// hits per clock-aligned period against L and the stated bound, counted by
// the leader from the pods' reports (a follower relays the request). Loaded
// on every update and every 2 s (periods end by the clock, not by epochs),
// one load at a time.
const ledger = { busy: false, at: 0, figures: new Map() };

async function loadLedger() {
  if (ledger.busy || Date.now() - ledger.at < 1000) return;
  ledger.busy = true;
  ledger.at = Date.now();
  try {
    renderLedger(await api("/api/v1/ledger?periods=30"));
  } catch (e) {
    $("ledger-note").textContent = "The ledger is kept by the leader: " + e.message;
    if (e.status === 401) throw e;
  } finally {
    ledger.busy = false;
  }
}

function renderLedger(a) {
  const ids = Object.keys(a.rules || {});
  $("ledger-note").textContent = ids.length
    ? "Served by node " + a.node_id + " (the leader). Each bar is one clock-aligned period: the busiest key's hits admitted world-wide, the sum of every pod's own count; pale bars are periods still counting (the current one, and one that ended until every pod's final count is in), red bars crossed the stated bound."
    : "No global rule in the enforced rule set.";
  $("ledger-how").textContent = a.how || "";
  for (const [id, fig] of ledger.figures) {
    if (!ids.includes(id)) {
      fig.remove();
      ledger.figures.delete(id);
    }
  }
  for (const id of ids) {
    let fig = ledger.figures.get(id);
    if (!fig) {
      fig = document.createElement("figure");
      fig.dataset.rule = id;
      const caption = document.createElement("figcaption");
      const chart = document.createElement("div");
      chart.className = "chart";
      const details = document.createElement("details");
      const summary = document.createElement("summary");
      summary.textContent = id + ": periods as a table";
      details.append(summary, document.createElement("table"));
      fig.append(caption, chart, details);
      $("ledger-charts").append(fig);
      ledger.figures.set(id, fig);
    }
    ledgerFigure(fig, id, a.rules[id]);
  }
}

function ledgerFigure(fig, id, r) {
  const open = (r.ending || []).concat([r.current]).map((p) => Object.assign({ open: true }, p));
  const periods = (r.periods || []).concat(open);
  const L = r.limit;
  const bound = r.current.bound;
  const worst = r.worst_last_hour;
  fig.querySelector("figcaption").textContent = id + " (" + r.algorithm + ", " + r.accuracy + "): world-wide admitted per " +
    period(r.period_ms) + " against L = " + fmt(L) + " and the stated bound " + fmt(bound) + " (" + r.bound_is + ")" +
    (worst ? "; worst period of the last hour " + fmt(worst.admitted) + " at " + time(worst.start_unix_ms) + " UTC" : "") +
    (r.periods_over_bound_last_hour ? "; " + r.periods_over_bound_last_hour + " period(s) over the bound in the last hour" : "");
  const container = fig.querySelector(".chart");
  const yMax = Math.max(1, L, bound, ...periods.map((p) => p.admitted)) * 1.05;
  const svg = frame(container, id + ": world-wide admitted per period against L " + fmt(L) + " and the bound " + fmt(bound));
  const t0 = periods[0].start_unix_ms;
  const t1 = periods[periods.length - 1].start_unix_ms + r.period_ms;
  const s = axes(svg, t0, t1, yMax);
  for (const p of periods) {
    const x0 = s.x(p.start_unix_ms), x1 = s.x(p.start_unix_ms + p.period_ms);
    const rect = el("rect", {
      x: x0, y: s.y(p.admitted), width: Math.max(1, x1 - x0 - 1), height: Math.max(0, s.y(0) - s.y(p.admitted)),
      class: "ledger-bar" + (p.open ? " open" : "") + (p.over_bound ? " over" : ""),
      "data-start": p.start_unix_ms, "data-value": p.admitted,
    }, svg);
    el("title", {}, rect).textContent = time(p.start_unix_ms) + " UTC: " + fmt(p.admitted) + " admitted" +
      (p.open ? " so far" : "") + (p.complete || p.open ? "" : " (not every pod's final count: a lower bound)");
  }
  // L solid, the bound dashed; labelled at the right (apart when equal).
  ledgerLine(svg, s, L, "L " + fmt(L), "ref limit", "", 4);
  ledgerLine(svg, s, bound, bound === L ? "bound = L" : "bound " + fmt(bound), "ref bound", "6 4", bound === L ? 18 : 4);
  table(fig.querySelector("table"), ["Period (UTC)", "Admitted (busiest key)", "Per region", "All keys", "L", "Bound", "Final"],
    periods.slice().reverse().map((p) => [time(p.start_unix_ms), fmt(p.admitted),
      Object.entries(p.regions || {}).map(([g, n]) => g + " " + fmt(n)).join(", ") || "—", fmt(p.all_keys), fmt(p.limit), fmt(p.bound),
      p.open ? (p === open[open.length - 1] ? "current" : "not yet") : p.complete ? "yes" : "partial"]), [2, 6]);
  const newestFirst = periods.slice().reverse();
  fig.querySelectorAll("tbody tr").forEach((tr, i) => {
    if (newestFirst[i] && newestFirst[i].over_bound) tr.className = "ledger-over";
  });
}

function ledgerLine(svg, s, value, label, cls, dash, dy) {
  const y = s.y(value);
  el("line", { x1: PAD.l, x2: PAD.l + s.w, y1: y, y2: y, stroke: "#b42318", "stroke-width": 1.5, "stroke-dasharray": dash, class: cls, "data-value": value }, svg);
  el("text", { x: PAD.l + s.w + 6, y: y + dy, fill: "#b42318" }, svg).textContent = label;
}

// ---- helpers ------------------------------------------------------------------

function row(cells, numeric) {
  const tr = document.createElement("tr");
  cells.forEach((c, i) => {
    const td = document.createElement(i === 0 ? "th" : "td");
    if (i === 0) td.scope = "row";
    if ((numeric || []).includes(i)) td.className = "n";
    td.textContent = String(c);
    tr.append(td);
  });
  return tr;
}

// `text`: columns other than the first that are not numbers (left-aligned).
function table(t, head, rows, text) {
  const thead = document.createElement("thead");
  const tr = document.createElement("tr");
  for (const h of head) {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = h;
    tr.append(th);
  }
  thead.append(tr);
  const tbody = document.createElement("tbody");
  const numeric = head.map((_, i) => i).slice(1).filter((i) => !(text || []).includes(i));
  for (const r of rows) tbody.append(row(r, numeric));
  t.replaceChildren(thead, tbody);
}

function fmt(n) {
  return typeof n === "number" ? n.toLocaleString("en-US", { maximumFractionDigits: 1 }) : String(n ?? "—");
}

function time(ms) {
  return new Date(ms).toISOString().slice(11, 19);
}

function dateTime(ms) {
  return new Date(ms).toISOString().slice(0, 19).replace("T", " ");
}

function period(ms) {
  if (!ms) return "period";
  if (ms % 3600000 === 0) return ms / 3600000 === 1 ? "hour" : ms / 3600000 + " h";
  if (ms % 60000 === 0) return ms / 60000 === 1 ? "minute" : ms / 60000 + " min";
  return ms / 1000 + " s";
}

function init() {
  readHash();
  $("token-state").textContent = state.token ? "(set for this tab)" : "(none; kept in this tab only)";
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim();
    sessionStorage.setItem(TOKEN_KEY, state.token);
    $("token").value = "";
    $("token-state").textContent = state.token ? "(set for this tab)" : "(none; kept in this tab only)";
  });
  $("token-forget").addEventListener("click", () => {
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    $("token-state").textContent = "(none; kept in this tab only)";
  });
  $("rule-select").addEventListener("change", (e) => {
    state.rule = e.target.value;
    state.key = "";
    state.keyChosen = false;
    state.history = null;
    loadHistory(false).catch(showError);
  });
  $("key-select").addEventListener("change", (e) => {
    state.key = e.target.value;
    state.keyChosen = true;
    loadHistory(false).catch(showError);
  });
  $("diff-show").addEventListener("click", showDiff);
  $("rollout").addEventListener("click", () => {
    const stage = $("rollout-stage").value;
    const regions = $("rollout-regions").value.split(",").map((r) => r.trim()).filter(Boolean);
    const body = { stage };
    if (stage === "canary") body.canary_regions = regions;
    act("Rollout", "/api/v1/rules/rollout", body);
  });
  $("rollback").addEventListener("click", () => {
    const to = $("rollback-to").value;
    act("Rollback", "/api/v1/rules/rollback", to ? { to: Number(to) } : {});
  });
  window.addEventListener("hashchange", onHashChange);
  $("drill-back").href = hashFor(null);
  showView(false);
  loadDrills().catch(showError);
  // Pods fall silent without any update saying so: look every 5 s.
  setInterval(() => { if (state.update) loadPods().catch(showError); }, 5000);
  // Periods end by the clock, not by epochs: look at the ledger every 2 s.
  setInterval(() => loadLedger().catch(showError), 2000);
  follow();
}

init();

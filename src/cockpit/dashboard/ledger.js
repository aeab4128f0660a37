// The world ledger: a chart and a table per global rule.
"use strict";

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

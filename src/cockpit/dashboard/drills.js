// Failover drills: the drills table, and the page of one drill's report
// (#drill=N).
"use strict";

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

// SVG charts: the frame and axes, stacked areas, grouped bars, a line,
// reference lines, and failover drills drawn as bands over time.
"use strict";

const COLORS = ["#0a58ca", "#e8710a", "#1e8e3e", "#a142f4", "#d01884", "#12b5cb", "#9e6a03", "#5f6368"];
const SVG = "http://www.w3.org/2000/svg";

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

// The dashboard's small helpers: the element lookup, table rows and
// tables, and how numbers, times and periods are written. Text only: every
// value goes in as textContent, never as markup.
"use strict";

// ---- helpers ------------------------------------------------------------------

const $ = (id) => document.getElementById(id);

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

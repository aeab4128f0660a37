// Usage: one key's use of its limit per region and world-wide (a search by
// domain and descriptor, or by rule and key), and per global rule the keys
// closest to or over their limit. Both from the leader's world ledger
// (/api/v1/usage, /api/v1/usage/top; a follower relays them), looked at
// every 2 s, one load at a time.
"use strict";

// ---- usage ------------------------------------------------------------------------

const usage = { busy: false, at: 0, query: null, tables: new Map() };

// The search as a query string: a descriptor with its domain, or a rule
// and a key (the key as a check by rule name gives it); null when neither
// is complete.
function usageQuery() {
  const p = new URLSearchParams();
  const domain = $("usage-domain").value.trim();
  const descriptor = $("usage-descriptor").value.trim();
  const rule = $("usage-rule").value.trim();
  const key = $("usage-key").value.trim();
  if (domain) p.set("domain", domain);
  if (descriptor) {
    p.set("descriptor", descriptor.split(/[;\s]+/).filter(Boolean).join(";"));
  } else if (rule && key) {
    p.set("rule", rule);
    p.set("key", key);
  } else {
    return null;
  }
  return p.toString();
}

function startUsage() {
  $("usage-form").addEventListener("submit", (e) => {
    e.preventDefault();
    usage.query = usageQuery();
    if (!usage.query) {
      $("usage-result").textContent = "Give a domain and a descriptor (customer=42;plan=gold), or a rule and a key.";
      $("usage-table").replaceChildren();
      return;
    }
    usage.at = 0;
    loadUsage().catch(showError);
  });
}

async function loadUsage() {
  if (usage.busy || Date.now() - usage.at < 1000) return;
  usage.busy = true;
  usage.at = Date.now();
  try {
    const top = api("/api/v1/usage/top?n=10");
    if (usage.query) {
      try {
        renderUsage(await api("/api/v1/usage?" + usage.query));
      } catch (e) {
        $("usage-result").textContent = "No usage: " + e.message;
        $("usage-table").replaceChildren();
        if (e.status === 401) throw e;
      }
    }
    try {
      renderTop(await top);
    } catch (e) {
      $("usage-top-note").textContent = "Top keys come from the leader's ledger: " + e.message;
      if (e.status === 401) throw e;
    }
  } finally {
    usage.busy = false;
  }
}

function age(ms) {
  return typeof ms === "number" ? (ms / 1000).toFixed(1) + " s" : "—";
}

function overrideText(o) {
  if (!o) return "—";
  return fmt(o.limit) + (o.expired ? " (expired)" : o.expires_at_unix_ms ? " until " + dateTime(o.expires_at_unix_ms) + " UTC" : "") +
    (o.reason ? " · " + o.reason : "");
}

function percent(ratio) {
  return typeof ratio === "number" ? (ratio * 100).toFixed(1) + " %" : "—";
}

function renderUsage(a) {
  const rows = [];
  const notes = [];
  for (const l of a.limits || []) {
    const o = overrideText(l.override);
    if (l.scope !== "global") {
      rows.push({ cells: [l.limit_id, "(each region)", "—", "—", "—", "—", fmt(l.limit), o, "—", "—"], region: "" });
      notes.push(l.limit_id + ": " + l.note);
      continue;
    }
    for (const r of l.regions || []) {
      const used = { counted: fmt(r.used), partial: fmt(r.used) + " (some pods)", not_tracked: "not tracked",
        not_reported: "not reported by its pods" }[r.figure] || "no report this period";
      rows.push({ cells: [l.limit_id, r.region, used, fmt(r.reserved), fmt(r.settled), fmt(r.allocation), fmt(l.key_limit), o, "—", age(r.age_ms)],
        region: r.region });
    }
    const w = l.world || {};
    rows.push({ cells: [l.limit_id, "world", w.used !== null ? fmt(w.used) : "not tracked", fmt(w.reserved), fmt(w.settled), fmt(w.allocation),
      fmt(l.key_limit), o, percent(w.ratio), "—"],
      region: "world", over: w.over });
    if (l.status === "not_tracked") notes.push(l.limit_id + ": the key is not among the busiest keys the leader tracks this period: its count is unknown, not 0.");
    if (l.status === "no_reports") notes.push(l.limit_id + ": no pod reported the period that began at " + time(l.period.start_unix_ms) + " UTC yet.");
    if (l.previous_period && l.previous_period.used !== null) {
      notes.push(l.limit_id + ": the period before used " + fmt(l.previous_period.used) + " (" + percent(l.previous_period.ratio) + ").");
    }
  }
  const t = $("usage-table");
  table(t, ["Limit", "Region", "Used this period", "Reserved (open)", "Settled", "Allocation", "Key's limit", "Override", "Use", "Age"],
    rows.map((r) => r.cells), [1, 7]);
  const caption = document.createElement("caption");
  caption.textContent = "Key " + a.key + " of rule " + a.rule + " (domain " + a.domain + "), at " + time(a.at_unix_ms) +
    " UTC; pods report every " + age(a.report_interval_ms) + ".";
  t.prepend(caption);
  [...t.tBodies[0].rows].forEach((tr, i) => {
    tr.dataset.region = rows[i].region;
    tr.dataset.limit = rows[i].cells[0];
    if (rows[i].over) tr.className = "usage-over";
  });
  $("usage-result").textContent = notes.join(" ") || "Served by node " + a.node_id + " (the leader).";
  t.dataset.key = a.key;
}

function renderTop(a) {
  const ids = Object.keys(a.rules || {});
  $("usage-top-note").textContent = ids.length
    ? "Per global rule, the tracked keys with the highest share of their limit (the override's where one is set) in the current period or the one before, from the pods' reports to the leader (node " + a.node_id + ")."
    : "No global rule in the enforced rule set.";
  for (const [id, t] of usage.tables) {
    if (!ids.includes(id)) {
      t.remove();
      usage.tables.delete(id);
    }
  }
  for (const id of ids) {
    let t = usage.tables.get(id);
    if (!t) {
      t = document.createElement("table");
      t.dataset.rule = id;
      $("usage-top").append(t);
      usage.tables.set(id, t);
    }
    topTable(t, id, a.rules[id]);
  }
}

function topTable(t, id, r) {
  const keys = r.keys || [];
  const head = ["Key", "Used", "Key's limit", "Use", "Period", "Override"];
  table(t, head, []);
  const tbody = t.tBodies[0];
  for (const k of keys) {
    const tr = document.createElement("tr");
    tr.dataset.key = k.key;
    if (k.over) tr.className = "usage-over";
    const th = document.createElement("th");
    th.scope = "row";
    const b = document.createElement("button");
    b.type = "button";
    b.className = "link";
    b.textContent = k.key;
    b.title = "Show " + k.key + "'s use per region";
    b.addEventListener("click", () => {
      $("usage-domain").value = "";
      $("usage-descriptor").value = "";
      $("usage-rule").value = id;
      $("usage-key").value = k.key;
      usage.query = usageQuery();
      usage.at = 0;
      loadUsage().catch(showError);
    });
    th.append(b);
    tr.append(th);
    const cells = [fmt(k.used), fmt(k.key_limit), percent(k.ratio) + (k.over ? " (over)" : ""),
      k.worst_period_start_unix_ms === r.current_start_unix_ms ? "current" : "from " + time(k.worst_period_start_unix_ms) + " UTC",
      overrideText(k.override)];
    cells.forEach((c, i) => {
      const td = document.createElement("td");
      if (i < 3) td.className = "n";
      td.textContent = c;
      tr.append(td);
    });
    tbody.append(tr);
  }
  if (!keys.length) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = head.length;
    td.className = "note";
    td.textContent = "No key tracked in the current or the last period.";
    tr.append(td);
    tbody.append(tr);
  }
  const caption = document.createElement("caption");
  caption.textContent = id + ": L = " + fmt(r.limit) + " per " + period(r.period_ms) + "; " + keys.length + " of " + fmt(r.candidates) + " tracked keys";
  t.prepend(caption);
}

// The regions and leases (with live pods), the Raft cluster, and rule
// versions with their diff, rollout and rollback.
"use strict";

// ---- regions, Raft, versions ----------------------------------------------------

// A pod counts as live when the leader heard it (a report or an
// acknowledgement) this recently. The leases API lists every pod the
// leader still tracks (up to two leases of silence) with when it was last
// heard, not the lease's length: the page draws the line itself and says
// so in the column's header.
const LIVE_POD_MS = 30000;

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

// The admin API: the token's header, one request, and the event stream
// (/api/v1/events) whose updates drive every section of the page.
"use strict";

const TOKEN_KEY = "meridian-admin-token";

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

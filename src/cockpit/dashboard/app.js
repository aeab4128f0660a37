// Meridian's dashboard. Reads the admin API of the node that served it and
// follows its event stream (/api/v1/events); draws its charts as SVG, with
// failover drills (/api/v1/drills) as bands on them, and a page per drill
// report (#drill=N). Nothing from the API goes into the DOM as markup: text
// only (textContent, attributes, createElement). The
// admin token lives in sessionStorage (this tab only) and travels as an
// Authorization header, never as a cookie.
//
// The script is several classic scripts, one job each, that index.html
// loads with defer in order: they share the global scope, and this one,
// loaded last, starts the page.
"use strict";

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
  // Usage too: the key searched for and the top keys, every 2 s.
  startUsage();
  loadUsage().catch(showError);
  setInterval(() => loadUsage().catch(showError), 2000);
  follow();
}

init();

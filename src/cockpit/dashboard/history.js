// The allocation-over-time section: the selected rule's (or key's)
// history, its key select, and its three charts with their tables.
"use strict";

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

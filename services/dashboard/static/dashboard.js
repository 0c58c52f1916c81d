// The dashboard's script: polls /ui/api/state (ETag, 304 when nothing changed; the history's
// rounds new or changed since the last answer only), draws the charts and tables, runs the
// recommendation panels and the operator actions. An update touches only what the new or
// changed rounds change: the versions table shows the newest rows (older ones on request) and
// the charts at most MAX_POINTS points, the newest TAIL_POINTS rounds exactly and every
// stride-th round before them, so a run of 100k rounds costs what one of a few thousand does.
// The operator token lives in this tab's sessionStorage (and in memory); it is sent in the
// Authorization header of an action and nowhere else: never in a URL, a cookie or a log.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const TOKEN_KEY = "fedrec-operator-token";
  const POLL_MS = Number(document.body.dataset.pollMs) || 2000;
  let etag = null;
  let last = null;
  // the run's closed rounds, in order, kept across polls: each poll brings only the rounds new
  // or changed since the token of the last answer (all of them when history_full)
  let historyToken = null;
  let rounds = [];
  const roundIndex = new Map(); // round id -> its index in rounds
  // sums over the rounds held, kept as rounds come and change: seconds, rounds with epsilon
  const totals = { seconds: 0, epsRounds: 0 };
  let skewMs = 0; // server clock minus browser clock, from the Date header
  const charts = {};

  // ------------------------------------------------------------------ formatting
  const fmt = (x, d = 4) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
  const text = (id, value) => { const el = $(id); if (el) el.textContent = value; };
  // four significant digits, without trailing zeros (0.0025, 1.234, 1e-7)
  const sig = (x) => (x === null || x === undefined ? "?" : String(Number(Number(x).toPrecision(4))));
  const given = (x) => x !== null && x !== undefined;
  const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }
  function cell(row, value) { const td = document.createElement("td"); td.textContent = value; row.appendChild(td); }

  // ------------------------------------------------------------------ charts
  const COLORS = { loss: "#1f4e9c", hr: "#1f4e9c", ndcg: "#b3261e", vhr: "#1b6e3a", vndcg: "#6b3fa0", eps: "#8a4b00", target: "#b3261e" };
  function makeChart(id, datasets, yTitle) {
    if (!window.Chart) return null;
    return new window.Chart($(id), {
      type: "line",
      data: { labels: [], datasets },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        interaction: { mode: "index", intersect: false },
        // series without data (validation metrics when the run has no validation split) stay out
        plugins: { legend: { labels: { filter: (item, data) => !data.datasets[item.datasetIndex].hidden } } },
        scales: { x: { title: { display: true, text: "round" } }, y: { title: { display: true, text: yTitle } } },
      },
    });
  }
  function line(label, color, dashed) {
    return { label, data: [], borderColor: color, backgroundColor: color, borderDash: dashed ? [6, 4] : [], pointRadius: 2, spanGaps: true };
  }
  function initCharts() {
    charts.loss = makeChart("chart-loss", [line("loss", COLORS.loss)], "loss");
    charts.metrics = makeChart("chart-metrics", [
      line("HR@10 (test)", COLORS.hr), line("NDCG@10 (test)", COLORS.ndcg),
      line("HR@10 (validation)", COLORS.vhr, true), line("NDCG@10 (validation)", COLORS.vndcg, true),
    ], "metric");
    charts.eps = makeChart("chart-eps", [line("ε spent", COLORS.eps), line("target ε", COLORS.target, true)], "ε");
  }
  // The rounds drawn: the newest TAIL_POINTS exactly, before them every stride-th round (by
  // index in rounds, stride a power of two, doubled when they would pass the rest of
  // MAX_POINTS). idx lists the drawn indices in order; every chart's labels and data arrays
  // run parallel to it and are changed in place, one round at a time.
  const MAX_POINTS = 2000;
  const TAIL_POINTS = 500;
  const DOTS_UP_TO = 300;
  // off: the first older index kept (eval_every - 1), so that in a run evaluating every few
  // rounds the kept rounds include evaluated ones (every lcm(stride, eval_every)-th round)
  const plot = { idx: [], stride: 1, off: 0, target: null };
  const metricOf = (r, key) => (r.metrics && key in r.metrics ? r.metrics[key] : null);
  const SERIES = {
    loss: [(r) => r.loss],
    metrics: [(r) => metricOf(r, "hr@10"), (r) => metricOf(r, "ndcg@10"), (r) => metricOf(r, "val/hr@10"), (r) => metricOf(r, "val/ndcg@10")],
    eps: [(r) => (given(r.epsilon) ? r.epsilon : null), () => plot.target],
  };
  function eachChart(f) {
    for (const [name, values] of Object.entries(SERIES)) if (charts[name]) f(charts[name], values);
  }
  // the values of round index i, at position p of every chart (inserted when insert is true)
  function putPoint(p, i, insert) {
    const r = rounds[i];
    eachChart((chart, values) => {
      if (insert) chart.data.labels.splice(p, 0, r.round_id); else chart.data.labels[p] = r.round_id;
      values.forEach((v, k) => { if (insert) chart.data.datasets[k].data.splice(p, 0, v(r)); else chart.data.datasets[k].data[p] = v(r); });
    });
  }
  function dropPoint(p) {
    eachChart((chart) => { chart.data.labels.splice(p, 1); for (const d of chart.data.datasets) d.data.splice(p, 1); });
  }
  // every chart drawn again from the rounds held (a new run, or the stride doubled)
  function resample() {
    const older = Math.max(0, rounds.length - TAIL_POINTS);
    while (Math.ceil(older / plot.stride) > MAX_POINTS - TAIL_POINTS) plot.stride *= 2;
    plot.idx = [];
    for (let i = Math.min(plot.off, older); i < older; i += plot.stride) plot.idx.push(i);
    for (let i = older; i < rounds.length; i += 1) plot.idx.push(i);
    eachChart((chart) => { chart.data.labels = []; for (const d of chart.data.datasets) d.data = []; });
    plot.idx.forEach((i, p) => putPoint(p, i, true));
  }
  // position of round index i among the drawn points, -1 when it is not drawn
  function drawnAt(i) {
    let lo = 0;
    let hi = plot.idx.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (plot.idx[mid] === i) return mid;
      if (plot.idx[mid] < i) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
  }
  function appendPoint(i) {
    plot.idx.push(i);
    putPoint(plot.idx.length - 1, i, true);
    // the round that just left the exact tail stays only on the stride
    const left = i - TAIL_POINTS;
    if (left >= 0 && (left < plot.off || (left - plot.off) % plot.stride !== 0)) {
      const p = plot.idx.length - TAIL_POINTS - 1;
      plot.idx.splice(p, 1);
      dropPoint(p);
    }
    if (plot.idx.length > MAX_POINTS) { plot.stride *= 2; resample(); }
  }
  // change: {full, added, changed}, indices into rounds (see mergeHistory)
  function drawCharts(change, cfg) {
    const target = cfg && given(cfg.target_epsilon) ? cfg.target_epsilon : null;
    text("chart-eps-caption", isDP(cfg) ? "Privacy spent (ε) after each round (target dashed where set)"
      : cfg ? "Privacy spent (ε): no differential privacy in this run" : "Privacy spent (ε) after each round");
    const retarget = target !== plot.target;
    plot.target = target;
    const off = cfg && cfg.eval_every > 1 ? cfg.eval_every - 1 : 0;
    const reoffset = off !== plot.off;
    plot.off = off;
    if (change.full || reoffset) { plot.stride = 1; resample(); } else {
      if (retarget && charts.eps) charts.eps.data.datasets[1].data.fill(target);
      for (const i of change.changed) { const p = drawnAt(i); if (p >= 0) putPoint(p, i, false); }
      for (const i of change.added) appendPoint(i);
      if (!retarget && !change.changed.length && !change.added.length) return;
    }
    eachChart((chart) => {
      // dots only while they can be told apart: thousands of them cost more than the lines
      const radius = chart.data.labels.length > DOTS_UP_TO ? 0 : 2;
      for (const d of chart.data.datasets) { d.hidden = !d.data.some((v) => v !== null); d.pointRadius = radius; }
      chart.update("none");
      chart.canvas.dataset.points = String(chart.data.labels.length);
      chart.canvas.dataset.rounds = String(rounds.length);
    });
  }

  // ------------------------------------------------------------------ the snapshot
  function render(s, change) {
    const run = s.run;
    const agg = s.aggregator;
    const aggDown = !run && agg && agg.error;
    text("ov-state", run ? run.state : aggDown ? `aggregator: ${agg.error}` : "–");
    // without the aggregator's answer the run is unknown, not absent
    text("ov-run", run && run.run_id ? `#${run.run_id}` : aggDown ? "unknown (no run state from the aggregator)" : "none yet");
    const cfg = run && run.config ? run.config : null;
    const planned = s.privacy && given(s.privacy.planned_rounds) ? s.privacy.planned_rounds : cfg ? cfg.rounds : null;
    const cut = cfg && planned !== null && planned < cfg.rounds ? ` (target ε ends it; ${cfg.rounds} configured)` : "";
    text("ov-round", run && run.round_id ? `${run.round_id} of ${planned ?? "?"}${cut}` : "–");
    text("ov-version", run && run.model_version !== null && run.model_version !== undefined ? `v${run.model_version}` : "–");
    const n = rounds.length;
    text("ov-time", n ? `${fmt(rounds[n - 1].seconds, 1)} s last, ${fmt(totals.seconds / n, 1)} s mean` : "–");
    text("ov-registered", s.registered === null ? "–" : String(s.registered));
    text("ov-size", run && run.size ? `${run.size.parameters.toLocaleString()} shared parameters (${bytes(run.size.bytes)} float32)` : "–");
    text("ov-serving", s.recommend ? (s.recommend.model_version !== null ? `model v${s.recommend.model_version}` : "no model yet") : "not configured");
    text("ov-counters", s.counters ? `${s.counters.rounds_retried} / ${s.counters.updates_refused}` : "–");
    text("ov-config", cfg ? JSON.stringify(cfg, null, 2) : "–");
    const wb = $("workers-table").tBodies[0];
    wb.replaceChildren();
    for (const w of s.workers) {
      const tr = document.createElement("tr");
      cell(tr, String(w.shard)); cell(tr, w.users ?? "–");
      cell(tr, w.registered === true ? "yes" : w.registered === false ? "no" : "–");
      cell(tr, w.ok ? "up" : `down (${w.error || "no answer"})`);
      wb.appendChild(tr);
    }
    renderPrivacy(s, cfg, planned);
    renderRound(s);
    renderVersions(s, change);
    drawCharts(change, cfg);
  }

  // a run is differentially private once dp_noise or target_epsilon is set
  const isDP = (cfg) => Boolean(cfg) && (given(cfg.dp_noise) || given(cfg.target_epsilon));
  function renderPrivacy(s, cfg, planned) {
    const eps = $("ov-eps");
    delete eps.dataset.epsilon;
    if (!cfg) { text("ov-eps", "–"); text("ov-eps-target", "–"); text("ov-privacy", "–"); return; }
    const secagg = cfg.secure_aggregation && cfg.secure_aggregation !== "off"
      ? `secure aggregation (${cfg.secure_aggregation})` : "no secure aggregation";
    if (!isDP(cfg)) {
      text("ov-eps", "no differential privacy");
      text("ov-eps-target", "none (no differential privacy)");
      text("ov-privacy", `no differential privacy; ${secagg}`);
      return;
    }
    const p = s.privacy || {};
    let newest = rounds.length - 1; // the newest round with an epsilon
    while (newest >= 0 && !given(rounds[newest].epsilon)) newest -= 1;
    const delta = `δ = ${sig(p.delta)}`;
    if (newest >= 0) {
      const e = rounds[newest].epsilon;
      eps.dataset.epsilon = String(e);
      text("ov-eps", `ε = ${sig(e)} at ${delta}, after ${plural(totals.epsRounds, "round")}`);
    } else {
      eps.dataset.epsilon = "0";
      text("ov-eps", `ε = 0 at ${delta} (no round released yet)`);
    }
    text("ov-eps-target", !given(cfg.target_epsilon) ? "none (dp_noise set, no target)"
      : `ε ≤ ${sig(cfg.target_epsilon)}: ` + (planned !== null && planned < cfg.rounds
        ? `the run stops after round ${planned} of ${cfg.rounds}` : `all ${plural(cfg.rounds, "round")} fit`));
    const z = `noise multiplier z = ${sig(p.noise_multiplier)}${given(cfg.dp_noise) ? "" : " (calibrated to the target)"}`;
    const sampling = cfg.sampling === "poisson" ? "Poisson" : "fixed-size";
    text("ov-privacy", `${cfg.dp_mode} DP (DP-FedAvg): ${z}, clip C = ${cfg.dp_clip}, ${sampling} cohort sampling; ${secagg}`);
  }

  function renderRound(s) {
    const r = s.round;
    const q = s.run && s.run.config ? s.run.config.quorum : null;
    text("rd-id", r ? `${r.round_id} / attempt ${r.attempt}` : "–");
    text("rd-state", r ? r.state : "–");
    text("rd-cohort", r ? String(r.cohort_size) : "–");
    text("rd-updates", r ? `${r.updates_received} of ${r.cohort_size}` : "–");
    const p = $("rd-progress");
    p.max = r && r.cohort_size ? r.cohort_size : 1;
    p.value = r ? r.updates_received : 0;
    // the aggregator's count: ceil(quorum * cohort), at least 1
    const needed = r && q !== null ? Math.max(1, Math.ceil(q * r.cohort_size - 1e-9)) : null;
    text("rd-quorum", needed !== null ? `${needed} of ${r.cohort_size} (quorum ${q})` : "–");
    // the aggregator's /metrics counter: every run since the aggregator started, not this run's
    const retried = s.counters ? `; ${plural(s.counters.rounds_retried, "retry", "retries")} since the aggregator started` : "";
    text("rd-retries", r ? `${plural(r.attempt, "retry", "retries")} (attempt ${r.attempt}, counting from 0)${retried}` : "–");
    tickDeadline();
  }

  function tickDeadline() {
    const r = last && last.round;
    if (!r || r.state !== "open" || !r.deadline) { text("rd-deadline", r ? `– (${r.state})` : "–"); return; }
    const left = (Date.parse(r.deadline) - (Date.now() + skewMs)) / 1000;
    text("rd-deadline", left > 0 ? `${Math.ceil(left)} s` : "due");
  }

  // The versions table: the newest `shown` rounds, newest first; rows are kept across updates
  // (round id -> its row): a new round adds its row at the top and pushes the oldest shown one
  // out, a changed round (its metrics came) replaces its own row, and nothing else is touched.
  const VERSIONS_PAGE = 50;
  const versions = { shown: VERSIONS_PAGE, rows: new Map(), size: null };
  function versionRow(r, size) {
    const tr = document.createElement("tr");
    const m = r.metrics || {};
    cell(tr, `v${r.model_version}`); cell(tr, String(r.round_id));
    cell(tr, new Date(r.closed_at).toLocaleTimeString()); cell(tr, fmt(r.seconds, 1));
    cell(tr, String(r.n_updates)); cell(tr, fmt(r.loss)); cell(tr, fmt(m["hr@10"])); cell(tr, fmt(m["ndcg@10"]));
    cell(tr, m.prior_weight === undefined ? "–" : String(m.prior_weight)); cell(tr, size);
    versions.rows.set(r.round_id, tr);
    return tr;
  }
  // rows for the rounds of indices from down to (not including) to, at the bottom
  function addOlderRows(tb, from, to) {
    const rows = document.createDocumentFragment();
    for (let i = from; i > to; i -= 1) rows.appendChild(versionRow(rounds[i], versions.size));
    tb.appendChild(rows);
  }
  function renderVersions(s, change) {
    const tb = $("versions-table").tBodies[0];
    const size = s.run && s.run.size ? bytes(s.run.size.bytes) : "–";
    const n = rounds.length;
    if (change.full || size !== versions.size) {
      versions.size = size;
      versions.rows.clear();
      tb.replaceChildren();
      addOlderRows(tb, n - 1, Math.max(-1, n - 1 - versions.shown));
    } else {
      for (const i of change.changed) {
        const old = versions.rows.get(rounds[i].round_id);
        if (old) old.replaceWith(versionRow(rounds[i], size));
      }
      const fresh = document.createDocumentFragment();
      const first = Math.max(0, change.added.length - versions.shown); // the newest only
      for (let k = change.added.length - 1; k >= first; k -= 1) fresh.appendChild(versionRow(rounds[change.added[k]], size));
      tb.insertBefore(fresh, tb.firstChild);
      while (tb.rows.length > versions.shown) {
        const gone = tb.lastElementChild;
        versions.rows.delete(Number(gone.cells[1].textContent));
        gone.remove();
      }
    }
    showVersionsNote();
  }
  function showVersionsNote() {
    const n = rounds.length;
    const shown = Math.min(n, versions.shown);
    text("versions-note", n > VERSIONS_PAGE || versions.shown > VERSIONS_PAGE
      ? `The newest ${shown.toLocaleString()} of ${n.toLocaleString()} versions (newest first).` : "");
    $("versions-more").hidden = shown >= n;
    text("versions-more", `Show ${Math.min(VERSIONS_PAGE, n - shown)} older versions`);
    $("versions-newest").hidden = versions.shown <= VERSIONS_PAGE;
    text("versions-newest", `Show only the newest ${VERSIONS_PAGE}`);
  }
  $("versions-more").addEventListener("click", () => {
    const n = rounds.length;
    const before = Math.min(n, versions.shown);
    versions.shown = before + VERSIONS_PAGE;
    addOlderRows($("versions-table").tBodies[0], n - 1 - before, Math.max(-1, n - 1 - versions.shown));
    showVersionsNote();
  });
  $("versions-newest").addEventListener("click", () => {
    versions.shown = VERSIONS_PAGE;
    const tb = $("versions-table").tBodies[0];
    while (tb.rows.length > versions.shown) {
      const gone = tb.lastElementChild;
      versions.rows.delete(Number(gone.cells[1].textContent));
      gone.remove();
    }
    showVersionsNote();
    if (!$("versions-more").hidden) $("versions-more").focus(); // this button is hidden now
  });

  // Take an answer's rounds in: all of them when history_full, else the rounds new or changed
  // since the last answer; which indices of rounds were added or changed.
  function mergeHistory(s) {
    const full = s.history_full !== false;
    if (full) { rounds = []; roundIndex.clear(); totals.seconds = 0; totals.epsRounds = 0; }
    const added = [];
    const changed = [];
    for (const r of s.history) {
      const i = roundIndex.get(r.round_id);
      if (i === undefined) {
        roundIndex.set(r.round_id, rounds.length); added.push(rounds.length); rounds.push(r);
      } else {
        const old = rounds[i];
        totals.seconds -= old.seconds || 0; totals.epsRounds -= given(old.epsilon) ? 1 : 0;
        rounds[i] = r; changed.push(i);
      }
      totals.seconds += r.seconds || 0; totals.epsRounds += given(r.epsilon) ? 1 : 0;
    }
    historyToken = s.history_token ?? null;
    s.history = rounds;
    return { full, added, changed };
  }

  async function poll() {
    try {
      const headers = etag ? { "If-None-Match": etag } : {};
      const query = historyToken ? `?history_since=${encodeURIComponent(historyToken)}` : "";
      const resp = await fetch(`/ui/api/state${query}`, { headers, cache: "no-store" });
      const date = resp.headers.get("Date");
      if (date) skewMs = Date.parse(date) - Date.now();
      if (resp.status === 200) {
        etag = resp.headers.get("ETag");
        last = await resp.json();
        render(last, mergeHistory(last));
      }
      const agg = last && last.aggregator;
      const stale = agg && !agg.ok ? `; no run state from the aggregator (${agg.error}): the figures shown are the last known` : "";
      text("conn", resp.ok || resp.status === 304 ? `Live: updated ${new Date().toLocaleTimeString()}${stale}` : `Dashboard answered ${resp.status}`);
    } catch (err) {
      text("conn", "Dashboard not reachable; retrying");
    }
    setTimeout(poll, POLL_MS);
  }

  // ------------------------------------------------------------------ recommendations
  // marks: the user's training items (a Set), null when unknown, undefined for no such column
  function showItems(tableId, items, marks) {
    const table = $(tableId);
    const tb = table.tBodies[0];
    tb.replaceChildren();
    items.forEach((it, i) => {
      const tr = document.createElement("tr");
      cell(tr, String(i + 1)); cell(tr, String(it.item)); cell(tr, fmt(it.score));
      if (marks !== undefined) {
        const train = marks !== null && marks.has(String(it.item));
        if (train) tr.classList.add("train");
        cell(tr, marks === null ? "?" : train ? "✔ training item" : "");
      }
      tb.appendChild(tr);
    });
    table.hidden = false;
  }
  // a request that got no answer (the dashboard not reachable, a header the browser refuses)
  const noAnswer = (err) => `No answer from the dashboard (${err && err.message ? err.message : err}); try again once it is reachable`;
  const problem = (resp, body) => `${resp.status} ${body && body.error ? body.error : ""}: ${body && body.detail ? body.detail : ""}`;

  $("rec-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    // the numbers the inputs hold, in plain digits: a number input takes "1e3" or "7.0" as
    // valid, which the dashboard's integer path and query would refuse as typed
    const number = (id) => { const el = $(id); return Number.isFinite(el.valueAsNumber) ? String(el.valueAsNumber) : el.value; };
    const user = encodeURIComponent(number("rec-user"));
    const k = encodeURIComponent(number("rec-k") || "10");
    const withTrain = $("rec-train").checked;
    text("rec-status", `Asking the worker of user ${decodeURIComponent(user)}…`);
    let resp, trainResp;
    try {
      [resp, trainResp] = await Promise.all([
        fetch(`/ui/api/users/${user}/recommendations?k=${k}&include_training=${withTrain}`),
        fetch(`/ui/api/users/${user}/training-items`),
      ]);
    } catch (err) {
      $("rec-table").hidden = true; $("rec-train-details").hidden = true;
      text("rec-status", noAnswer(err));
      return;
    }
    const body = await resp.json().catch(() => null);
    const trainBody = await trainResp.json().catch(() => null);
    if (!resp.ok) {
      $("rec-table").hidden = true; $("rec-train-details").hidden = true;
      text("rec-status", `Refused: ${problem(resp, body)}`);
      return;
    }
    const train = trainResp.ok && trainBody ? trainBody.items : null;
    const marks = train ? new Set(train) : null;
    showItems("rec-table", body.items, marks);
    let note;
    if (!train) note = `training items unknown (${problem(trainResp, trainBody)})`;
    else if (withTrain) note = `${plural(body.items.filter((it) => marks.has(String(it.item))).length, "training item")} among them (marked) of the user's ${train.length}`;
    else note = `the user's ${plural(train.length, "training item")} left out by the worker`;
    text("rec-status", `User ${decodeURIComponent(user)}: top ${body.items.length}, model v${body.model_version}; ${note}`);
    $("rec-train-details").hidden = !train;
    if (train) {
      text("rec-train-summary", `The user's ${plural(train.length, "training item")} (from the worker's device API)`);
      text("rec-train-items", train.join(", "));
    }
  });

  const recapi = $("recapi-form");
  if (recapi) {
    recapi.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      text("recapi-status", "Sending…");
      let resp;
      try {
        resp = await fetch("/ui/api/recommendations", {
          method: "POST", headers: { "Content-Type": "application/json" }, body: $("recapi-body").value,
        });
      } catch (err) {
        $("recapi-table").hidden = true; text("recapi-status", noAnswer(err));
        return;
      }
      const body = await resp.json().catch(() => null);
      if (!resp.ok) { $("recapi-table").hidden = true; text("recapi-status", `Refused: ${problem(resp, body)}`); return; }
      showItems("recapi-table", body.items);
      text("recapi-status", `Top ${body.items.length}, model v${body.model_version}`);
    });
  }

  // ------------------------------------------------------------------ operator
  let token = sessionStorage.getItem(TOKEN_KEY);
  function operatorState() {
    const on = Boolean(token);
    $("op-actions").disabled = !on;
    $("start-fields").disabled = !on;
    text("op-state", on ? "Operator token set for this tab." : "No operator token in this tab.");
  }
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("op-token").value.trim();
    $("op-token").value = "";
    if (!value) {
      // nothing typed: said, and the tab's token (if any) kept
      text("op-state", token ? "No token typed: this tab keeps the operator token it has."
        : "No token typed: type the operator token, then Use token.");
      $("op-token").focus();
      return;
    }
    token = value;
    sessionStorage.setItem(TOKEN_KEY, value);
    operatorState();
  });
  $("op-forget").addEventListener("click", () => {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    operatorState();
  });

  // the start form's inputs: clear their error marks, or mark the one a refusal names
  function clearFieldErrors() {
    for (const el of document.querySelectorAll("#start-form [data-field]")) {
      el.removeAttribute("aria-invalid");
      text(`cfg-${el.dataset.field}-error`, "");
    }
  }
  // a configuration refusal, readable: "dp_noise: Input should be ..." with that input marked;
  // a refusal of several fields ("body.a: ...; body.b: ...") marks each with its own message
  function configProblem(resp, answer) {
    if (!answer || typeof answer.detail !== "string") return problem(resp, answer);
    const parts = answer.detail.split(/; (?=body[.:])/).map(
      (part) => part.replace(/^body: (Value error, )?/, "").replace(/^body\./, ""));
    for (const part of parts) {
      const m = /^([a-z_]+): ([\s\S]*)$/.exec(part);
      const el = m ? $(`cfg-${m[1]}`) : null;
      if (el) {
        el.setAttribute("aria-invalid", "true");
        text(`cfg-${m[1]}-error`, m[2]);
      }
    }
    return `${resp.status} ${answer.error || ""}: ${parts.join("; ")}`;
  }

  // one operator call at a time: a second click (a double click on Start run) before the
  // first's answer would be sent too, and its refusal (409 run_active) could arrive last and
  // hide that the first one worked
  let pending = null;
  async function operator(path, body) {
    const what = path === "/ui/api/runs" ? "start" : path.split("/").pop();
    if (pending) { text("op-result", `Waiting for the answer to ${pending}; nothing else was sent.`); return 0; }
    pending = what;
    for (const id of ["op-actions", "start-form"]) $(id).setAttribute("aria-busy", "true");
    try {
      return await send(path, body);
    } finally {
      pending = null;
      for (const id of ["op-actions", "start-form"]) $(id).removeAttribute("aria-busy");
    }
  }
  async function send(path, body) {
    const headers = { "Content-Type": "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const starting = path === "/ui/api/runs";
    if (starting) clearFieldErrors();
    text("op-result", starting ? "Starting a run…" : `Sending ${path.split("/").pop()}…`);
    let resp;
    try {
      resp = await fetch(path, { method: "POST", headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (err) {
      // it may or may not have reached the aggregator: the run's state above tells
      text("op-result", `${noAnswer(err)}; the run's state above shows whether it took effect.`);
      etag = null;
      return 0;
    }
    const answer = await resp.json().catch(() => null);
    if (resp.status === 401 && token) {
      // the token typed is not the operator's: say so where the token is
      text("op-state", "The aggregator refused this tab's operator token (401): enter the operator token, or forget this one.");
    } else if (resp.ok) operatorState();
    if (resp.ok) {
      text("op-result", `Done: run #${answer.run_id} is ${answer.state}${answer.round_id ? `, round ${answer.round_id}` : ""}.`);
    } else {
      text("op-result", `Refused: ${starting ? configProblem(resp, answer) : problem(resp, answer)}`);
    }
    etag = null; // show the effect at the next poll
    return resp.status;
  }
  // stop ends the run for good (its open round aborted, no resume): asked for first
  function confirmStop() {
    const run = last && last.run && last.run.run_id ? `run #${last.run.run_id}` : "the run";
    if (window.confirm(`Stop ${run} for good? A stopped run cannot be resumed; its open round is aborted.`)) return true;
    text("op-result", `Not stopped: ${run} goes on.`);
    return false;
  }
  for (const b of document.querySelectorAll("#op-actions button")) {
    b.addEventListener("click", () => {
      if (b.dataset.action === "stop" && !confirmStop()) return;
      operator(`/ui/api/runs/current/${b.dataset.action}`);
    });
  }
  // a preset fills every setting: its own value, else the run settings' default
  $("cfg-preset").addEventListener("change", () => {
    const presets = JSON.parse($("cfg-preset").dataset.presets);
    const chosen = presets[$("cfg-preset").value] || {};
    for (const el of document.querySelectorAll("#start-form [data-field]")) {
      if (el.dataset.field === "n_items") continue;  // the catalogue's, not a preset's
      const v = chosen[el.dataset.field];
      el.value = v === undefined ? el.dataset.default : v === null ? "" : String(v);
    }
  });
  $("start-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const cfg = {};
    for (const el of document.querySelectorAll("#start-form [data-field]")) {
      const v = el.value.trim();
      if (v === "") { if (el.dataset.optional === "yes") cfg[el.dataset.field] = null; continue; }
      const kind = el.dataset.kind;
      cfg[el.dataset.field] = kind === "integer" || kind === "number" ? Number(v) : kind === "boolean" ? v === "true" : v;
    }
    operator("/ui/api/runs", cfg);
  });

  // prefill the catalogue size from the current run, once
  function prefill() {
    const n = $("cfg-n_items");
    if (n && !n.value && last && last.run && last.run.config) n.value = last.run.config.n_items;
  }

  // expose the operator call for the browser tests' refusal check
  window.fedrecDashboard = { operator };
  operatorState();
  initCharts();
  setInterval(() => { tickDeadline(); prefill(); }, 1000);
  poll();
})();

// The swarm-node dashboard: polls the node's JSON API every few seconds and draws it. No build step.
// Every number shown carries its raw value in data-value, so a test can compare it with the API.
"use strict";

const REFRESH_MS = 3000;
const SMOOTH = 10;  // steps in the reward's trailing mean
const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];

const state = {
  token: null,
  since: 0,
  rows: { step: [], reward: [], rewardAvg: [], peerReward: [], evalAcc: [], tokens: [], genTokens: [], own: [], peers: [] },
  charts: {},
  timer: null,
};

function readToken() {
  const m = location.hash.match(/token=([^&]+)/);
  if (m) {
    sessionStorage.setItem("swarm-node-token", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname);  // the token does not stay in the address bar
  }
  state.token = sessionStorage.getItem("swarm-node-token");
}

async function api(path) {
  const headers = state.token ? { Authorization: "Bearer " + state.token } : {};
  const res = await fetch(path, { headers, cache: "no-store" });
  if (res.status === 401) {
    $("token-form").hidden = false;
    throw new Error("this node wants a bearer token");
  }
  if (!res.ok && res.status !== 503) throw new Error(path + ": HTTP " + res.status);
  return res.json();
}

function fmt(x, digits) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

function bytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(1) + " MiB";
}

function ago(t, now) {
  return t === null ? "-" : duration(Math.max(0, now - t)) + " ago";
}

function short(id) {
  return id && id.length > 16 ? id.slice(0, 8) + "…" + id.slice(-6) : (id || "");
}

function renderStatus(s) {
  const badge = $("state");
  badge.textContent = s.healthy ? s.state : s.state + " (stalled)";
  badge.className = "badge " + (s.healthy ? s.state : "unhealthy");
  badge.dataset.value = s.state;
  $("identity").textContent = [s.mode, s.model + " (" + s.adapter + ")", s.swarm_id ? "swarm " + s.swarm_id : null,
    s.peer_id ? "peer " + s.peer_id : null, "run " + s.run_dir, "v" + s.version].filter(Boolean).join(" · ");
  setValue("step", s.step, String(s.step));
  setValue("total-steps", s.total_steps, s.total_steps === null ? "" : " / " + s.total_steps);
  $("steps-note").textContent = s.total_steps === null ? "until stopped" : "";
  setValue("reward", s.last_reward, fmt(s.last_reward, 3));
  setValue("eval", s.last_eval ? s.last_eval.accuracy : null, s.last_eval ? fmt(s.last_eval.accuracy, 3) : "-");
  $("eval-step").textContent = s.last_eval ? "at step " + s.last_eval.step : "not evaluated yet";
  setValue("tokens", s.tokens_per_s, s.tokens_per_s === null ? "-" : Math.round(s.tokens_per_s).toLocaleString("en-US"));
  const median = s.recent && s.recent.steps ? s.recent.step_seconds_median : null;
  $("step-seconds").textContent = median !== null ? fmt(median, 2) + " s a step (median of " + s.recent.steps + ")"
    : s.step_seconds === null ? "" : fmt(s.step_seconds, 2) + " s a step";
  const net = $("network");
  const silo = s.mode === "silo";
  // connected: at least one peer answered (the definition the status API and `swarm-node status` use)
  setValue("network", s.network.connected, silo ? "off" : s.network.connected ? "connected" : "not connected");
  net.className = "value " + (silo ? "" : s.network.connected ? "up" : "down");
  setValue("network-reason", s.network.reason, s.network.reason +
    (s.network.restarts ? " · " + s.network.restarts + " restarts, last: " + s.network.last_error : ""));
  $("published").textContent = s.mode === "swarm" ?
    s.published.batches + " batches / " + s.published.groups + " groups shared" : "";
  setValue("uptime", s.uptime_s, duration(s.uptime_s));
  $("health").textContent = s.healthy ? "healthy" : "no progress: see /healthz";
  $("updated").textContent = "updated " + new Date(s.time * 1000).toLocaleTimeString();
}

function renderPeers(doc) {
  const body = $("peers").tBodies[0];
  const rows = doc.peers;
  setValue("peer-count", rows.length, String(rows.length));
  body.replaceChildren();
  if (!rows.length) {
    const tr = body.insertRow();
    tr.className = "empty";
    const td = tr.insertCell();
    td.colSpan = 10;
    td.textContent = "no peers yet";
    return;
  }
  for (const p of rows) {
    const tr = body.insertRow();
    tr.dataset.peer = p.peer_id;
    const rejected = Object.entries(p.rejected).map(([r, n]) => r + ": " + n).join(", ") || "-";
    const cells = [
      [short(p.peer_id), p.peer_id], [p.connected ? "yes" : "no", p.connected],
      [String(p.batches_accepted), p.batches_accepted], [String(p.groups_accepted), p.groups_accepted],
      [String(p.groups_ingested), p.groups_ingested], [rejected, JSON.stringify(p.rejected)],
      [bytes(p.bytes_in), p.bytes_in], [bytes(p.bytes_out), p.bytes_out], [ago(p.last_seen, doc.time), p.last_seen],
      [p.banned_until ? new Date(p.banned_until * 1000).toLocaleTimeString() : "-", p.banned_until],
    ];
    const names = ["peer", "connected", "batches_accepted", "groups_accepted", "groups_ingested", "rejected",
      "bytes_in", "bytes_out", "last_seen", "banned_until"];
    cells.forEach(([text, raw], i) => {
      const td = tr.insertCell();
      td.textContent = text;
      td.dataset.field = names[i];
      td.dataset.value = raw === null ? "" : String(raw);
      if (i === 0) { td.className = "id"; td.title = p.peer_id; }
    });
  }
}

function num(v) { return typeof v === "number" ? v : null; }

function trailingMean(values, n) {
  const window = values.slice(-n).filter((v) => v !== null);
  return window.length ? window.reduce((a, b) => a + b, 0) / window.length : null;
}

function addRows(rows) {
  const R = state.rows;
  for (const r of rows) {
    R.step.push(r.step);
    R.reward.push(num(r.reward_mean));
    R.rewardAvg.push(trailingMean(R.reward, SMOOTH));
    R.peerReward.push(num(r.peer_reward_mean));
    R.evalAcc.push(num(r.eval_accuracy));
    R.tokens.push(num(r.tokens_per_s));
    R.genTokens.push(num(r.gen_tokens_per_s));
    R.own.push(num(r.n_local_groups));
    R.peers.push(num(r.n_peer_groups));
    state.since = r.step;
  }
}

function chartWidth(el) { return Math.max(300, el.clientWidth - 20); }

function makeChart(id, series, data, yRange, yIncrs) {
  const el = $(id);
  const opts = {
    width: chartWidth(el), height: 210,
    scales: { x: { time: false }, y: yRange ? { range: yRange } : {} },
    axes: [{ label: "step", incrs: STEP_INCRS }, yIncrs ? { incrs: yIncrs } : {}],
    legend: { live: false },
    series: [{ label: "step" }, ...series],
  };
  const chart = new uPlot(opts, data, el);
  state.charts[id] = chart;
  return chart;
}

function chartData() {
  const R = state.rows;
  return {
    "chart-reward": [R.step, R.reward, R.rewardAvg, R.peerReward],
    "chart-eval": [R.step, R.evalAcc],
    "chart-tokens": [R.step, R.tokens, R.genTokens],
    "chart-groups": [R.step, R.own, R.peers],
  };
}

function drawCharts() {
  const data = chartData();
  if (!state.charts["chart-reward"]) {
    const line = (label, stroke, extra) => Object.assign({ label, stroke, width: 1.5, spanGaps: true }, extra || {});
    makeChart("chart-reward", [line("own groups", "#93c5fd", { width: 1 }), line("own, mean of " + SMOOTH, OWN, { width: 2.5 }),
      line("peers' groups", PEERS, { spanGaps: false })], data["chart-reward"], [0, 1]);
    makeChart("chart-eval", [line("accuracy", OWN, { points: { show: true, size: 6 } })], data["chart-eval"], [0, 1]);
    makeChart("chart-tokens", [line("tokens/s (generate + train)", OWN), line("tokens/s (generate)", THIRD)],
      data["chart-tokens"]);
    makeChart("chart-groups", [line("own", OWN), line("from peers", PEERS)], data["chart-groups"], null, STEP_INCRS);
  } else {
    for (const [id, d] of Object.entries(data)) state.charts[id].setData(d);
  }
  for (const [id, d] of Object.entries(data)) {
    const el = $(id);
    el.dataset.points = String(d[0].length);
    el.dataset.last = d[0].length ? String(d[1][d[1].length - 1]) : "";
  }
}

async function refresh() {
  try {
    const [status, peers] = await Promise.all([api("/api/status"), api("/api/peers")]);
    let more = true;
    while (more) {  // all rows after the last one we have (paged by the server)
      const page = await api("/api/metrics?since=" + state.since);
      addRows(page.rows);
      more = page.more && page.rows.length > 0;
    }
    renderStatus(status);
    renderPeers(peers);
    drawCharts();
    $("error").hidden = true;
    document.body.dataset.loaded = String(status.step);
  } catch (err) {
    $("error").textContent = "cannot reach the node: " + err.message;
    $("error").hidden = false;
  }
}

function start() {
  readToken();
  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("token-input").value;
    sessionStorage.setItem("swarm-node-token", state.token);
    $("token-form").hidden = true;
    refresh();
  });
  window.addEventListener("resize", () => {
    for (const [id, chart] of Object.entries(state.charts)) chart.setSize({ width: chartWidth($(id)), height: 210 });
  });
  refresh();
  state.timer = setInterval(refresh, REFRESH_MS);
}

start();

// The swarm-node host's status page: polls /api/swarm every few seconds and draws it. No build step.
// Every number shown carries its raw value in data-value, so a test can compare it with the API.
"use strict";

const REFRESH_MS = 3000;
const EPOCHS = 8;  // the epochs the host keeps per member
const HISTORY = 60;  // epochs of the swarm's totals in the charts
const charts = {};
let epochSeconds = 60;  // the swarm's, from the last answer: one point on a chart spans an epoch either side

function ago(t, now) { return t === null || t === undefined ? "-" : duration(Math.max(0, now - t)) + " ago"; }
function bytes(n) {
  if (n < 1024) return n + " B";
  if (n < 1024 * 1024) return (n / 1024).toFixed(1) + " KiB";
  return (n / 1024 / 1024).toFixed(1) + " MiB";
}
function clock(t) { return new Date(t * 1000).toTimeString().slice(0, 5); }
function short(id) { return id && id.length > 16 ? id.slice(0, 8) + "…" + id.slice(-6) : (id || "-"); }

function renderHost(doc) {
  const h = doc.host, s = doc.swarm, net = h.network;
  const healthy = net.alive && h.addresses.length > 0;
  const badge = $("state");
  badge.textContent = healthy ? "serving" : "down";
  badge.className = "badge " + (healthy ? "training" : "unhealthy");
  badge.dataset.value = String(healthy);
  setValue("this-host", h.label, h.label + (h.libp2p_id ? " · libp2p peer id " + short(h.libp2p_id) : ""));
  $("this-host").title = h.address || "";
  $("identity").textContent = ["swarm " + s.id, "owner " + s.owner, "wire protocol " + s.protocol_version,
    "v" + h.version].join(" · ");
  setValue("swarm", s.id, s.name);
  $("swarm-sub").textContent = s.tasks.source + ": " + s.tasks.datasets.join(", ") + " · epoch " + s.epoch_seconds +
    " s · valid until " + new Date(s.expires * 1000).toISOString().slice(0, 16).replace("T", " ") + " UTC";
  const natted = doc.members.filter((m) => m.natted && m.running).length;
  setValue("members-running", h.members_running, String(h.members_running));
  setValue("members", doc.members.length, doc.members.length + " seen since " + clock(h.since) + " · " + natted +
    " running behind NAT");
  // Each batch once per way it came: pulled + handed off = verified here, never more than the batches known.
  const sum = (rows, field) => rows.reduce((a, m) => a + field(m), 0);
  const announced = sum(doc.members, (m) => m.announced);
  const pulled = sum(doc.members, (m) => m.pulled), handed = sum(doc.members, (m) => m.handed_off);
  setValue("announced", announced, announced + " announced");
  setValue("pulled", pulled + handed, pulled + " pulled from members · " + handed + " handed to this host");
  const total = (way) => sum(doc.members, (m) => m.totals[way]);
  setValue("total-announced", total("announced"), total("announced") + " announced");
  setValue("total-pulled", total("pulled") + total("handed_off"),
    total("pulled") + " pulled · " + total("handed_off") + " handed to this host");
  setValue("network", net.connected, net.connected ? "connected" : "no member connected");
  $("network").className = "value " + (net.connected ? "up" : "down");
  setValue("network-reason", net.reason, net.connections + " peers connected · " + net.neighbours +
    " DHT neighbours · " + net.reason);
  const up = doc.hosts.filter((x) => x.ok).length;
  setValue("hosts-up", up, doc.hosts.length ? up + " / " + doc.hosts.length : "none");
  $("hosts-sub").textContent = doc.hosts.length ? "pinged every few tens of seconds" : "this is the only host";
  setValue("handoffs", h.counters.handoffs_held, String(h.counters.handoffs_held));
  $("bytes").textContent = bytes(h.counters.bytes_in) + " in · " + bytes(h.counters.bytes_out) + " out";
  setValue("uptime", h.uptime_s, duration(h.uptime_s));
  setValue("memory", h.rss_bytes, bytes(h.rss_bytes) + " resident");
  $("updated").textContent = "updated " + new Date(doc.time * 1000).toLocaleTimeString();
}

function fillTable(id, rows, empty, cellsOf) {
  const body = $(id).tBodies[0];
  body.replaceChildren();
  if (!rows.length) {
    const td = body.insertRow().insertCell();
    td.parentElement.className = "empty";
    td.colSpan = $(id).tHead.rows[0].cells.length;
    td.textContent = empty;
    return;
  }
  for (const row of rows) {
    const tr = body.insertRow();
    for (const [field, text, raw] of cellsOf(row, tr)) {
      const td = tr.insertCell();
      td.textContent = text;
      td.dataset.field = field;
      td.dataset.value = raw === null || raw === undefined ? "" : String(raw);
    }
  }
}

function renderMembers(doc) {
  fillTable("members-table", doc.members, "no member seen yet", (m, tr) => {
    tr.dataset.member = m.peer_id;
    const perEpoch = m.epochs.map((e) => clock(e.start) + " " + e.announced + "/" + e.pulled + "/" + e.handed_off)
      .join(" · ");
    const t = m.totals;
    return [["peer", short(m.peer_id), m.peer_id], ["running", m.running ? "yes" : "no (stopped?)", m.running],
      ["model", m.model || "-", m.model],
      ["tokenizer", m.tokenizer || "-", m.tokenizer], ["protocol", m.protocol === null ? "-" : "v" + m.protocol, m.protocol],
      ["natted", m.natted ? "yes" : "no", m.natted], ["announced", String(m.announced), m.announced],
      ["pulled", String(m.pulled), m.pulled], ["handed_off", String(m.handed_off), m.handed_off],
      ["epochs", perEpoch, JSON.stringify(m.epochs)],
      ["totals", t.announced + "/" + t.pulled + "/" + t.handed_off, JSON.stringify(t)], ["first_seen", ago(m.first_seen, doc.time), m.first_seen],
      ["last_seen", ago(m.last_seen, doc.time), m.last_seen]];
  });
}

function renderHosts(doc) {
  fillTable("hosts-table", doc.hosts, "no other host in the descriptor", (h, tr) => {
    tr.dataset.host = h.address;
    const answers = h.ok === null ? "not checked yet" : h.ok ? "yes" : "no";
    return [["label", h.label, h.label], ["address", h.address, h.address], ["ok", answers, h.ok],
      ["rtt", h.rtt_s === null ? "-" : (h.rtt_s * 1000).toFixed(0) + " ms", h.rtt_s],
      ["checked_at", ago(h.checked_at, doc.time), h.checked_at], ["last_ok_at", ago(h.last_ok_at, doc.time), h.last_ok_at]];
  });
}

function epochSeries(doc) {
  // The swarm per epoch, oldest first, at each epoch's start time (Unix seconds).
  const h = doc.history;
  return { times: h.map((e) => e.start), announced: h.map((e) => e.announced), pulled: h.map((e) => e.pulled),
    handed: h.map((e) => e.handed_off), members: h.map((e) => e.members) };
}

function chartWidth(el) { return Math.max(300, el.clientWidth - 20); }

function drawCharts(doc) {
  epochSeconds = doc.swarm.epoch_seconds;
  const d = epochSeries(doc);
  const data = { "chart-epochs": [d.times, d.announced, d.pulled, d.handed], "chart-members": [d.times, d.members] };
  if (!charts["chart-epochs"]) {
    const line = (label, stroke) => ({ label, stroke, width: 2, points: { show: true, size: 4 } });
    const make = (id, series) => {
      const el = $(id);
      charts[id] = new uPlot({ width: chartWidth(el), height: 210, scales: { x: { time: true } },
        axes: [{ label: "epoch start" }, {}], legend: { live: false },
        series: [{ label: "epoch start" }, ...series] }, data[id], el);
    };
    make("chart-epochs", [line("announced", OWN), line("pulled here", THIRD), line("handed to this host", PEERS)]);
    make("chart-members", [line("members announcing", OWN)]);
  } else {
    for (const [id, values] of Object.entries(data)) charts[id].setData(values);
  }
  for (const [id, values] of Object.entries(data)) {
    // One epoch so far (a host just started): an epoch either side of it, not years.
    if (values[0].length === 1) charts[id].setScale("x", { min: values[0][0] - epochSeconds, max: values[0][0] + epochSeconds });
    $(id).dataset.points = String(values[0].length);
    $(id).dataset.first = values[0].length ? String(values[0][0]) : "";
    $(id).dataset.last = values[0].length ? String(values[1][values[1].length - 1]) : "";
  }
}

async function refresh() {
  try {
    const res = await fetch("/api/swarm?epochs=" + EPOCHS + "&history=" + HISTORY, { cache: "no-store" });
    if (!res.ok) throw new Error("/api/swarm: HTTP " + res.status);
    const doc = await res.json();
    renderHost(doc);
    renderMembers(doc);
    renderHosts(doc);
    drawCharts(doc);
    $("error").hidden = true;
    document.body.dataset.loaded = String(doc.time);
  } catch (err) {
    $("error").textContent = "cannot reach the host: " + err.message;
    $("error").hidden = false;
  }
}

window.addEventListener("resize", () => {
  for (const [id, chart] of Object.entries(charts)) chart.setSize({ width: chartWidth($(id)), height: 210 });
});
refresh();
setInterval(refresh, REFRESH_MS);

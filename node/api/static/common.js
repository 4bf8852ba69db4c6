// What the node's dashboard and the host's status page share: loaded before either page's own script.
"use strict";

const OWN = "#2563eb", PEERS = "#ea580c", THIRD = "#16a34a";

function $(id) { return document.getElementById(id); }

// Show text in element id, keeping the raw value in data-value for tests to compare with the API.
function setValue(id, raw, text) {
  const el = $(id);
  el.dataset.value = raw === null || raw === undefined ? "" : String(raw);
  el.textContent = text;
}

function duration(s) {
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
  return (h ? h + "h " : "") + (h || m ? m + "m " : "") + sec + "s";
}

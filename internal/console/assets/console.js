// The live console: swaps in each rendering the server pushes (html/template output, already
// escaped) and keeps open whatever the reader opened. No polling: one EventSource.
"use strict";
window.consoleLoadedAt = Date.now();
window.consoleUpdates = 0;
(function () {
  const view = document.getElementById("view");
  const conn = document.getElementById("conn");
  const events = new EventSource("events");
  events.addEventListener("view", function (e) {
    const open = new Set();
    view.querySelectorAll("details[open]").forEach(function (d) { open.add(d.id); });
    const doc = new DOMParser().parseFromString(e.data, "text/html");
    doc.querySelectorAll("details").forEach(function (d) { if (open.has(d.id)) d.open = true; });
    view.replaceChildren(...doc.body.childNodes);
    window.consoleUpdates++;
    conn.textContent = "live";
  });
  events.onopen = function () { conn.textContent = "live"; };
  events.onerror = function () {
    // CLOSED: the server refused the stream (a restarted up logged this page out); the
    // browser will not retry, a reload shows the login.
    conn.textContent = events.readyState === EventSource.CLOSED ? "disconnected: reload" : "reconnecting";
  };
})();

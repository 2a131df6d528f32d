// Forkyard console: the run page kept live over Server-Sent Events.
// The server sends each batch of changes as redrawn, already escaped HTML fragments
// keyed by element id; this script only swaps them in. No inline script anywhere: the
// content security policy allows this file alone.
"use strict";

(function () {
  const table = document.querySelector("[data-events]");
  if (!table || !window.EventSource) {
    return;
  }
  const body = document.body;
  let patches = 0;
  const source = new EventSource(table.getAttribute("data-events"));
  body.setAttribute("data-live", "connecting");
  source.addEventListener("open", function () {
    body.setAttribute("data-live", "open");
  });
  source.addEventListener("patch", function (event) {
    const html = JSON.parse(event.data).html || {};
    for (const [id, fragment] of Object.entries(html)) {
      const element = document.getElementById(id);
      if (element) {
        element.outerHTML = fragment;
      }
    }
    patches += 1;
    body.setAttribute("data-patches", String(patches));
  });
  source.addEventListener("end", function () {
    // The run finished: nothing more will come, so no reconnect either.
    source.close();
    body.setAttribute("data-live", "finished");
  });
  source.addEventListener("error", function () {
    // EventSource reconnects by itself; say so on the page meanwhile.
    if (source.readyState !== EventSource.CLOSED) {
      body.setAttribute("data-live", "reconnecting");
    }
  });
})();

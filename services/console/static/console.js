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
  const url = table.getAttribute("data-events");
  let patches = 0;
  let connects = 0;
  let opens = 0;
  let finished = false;

  function replace(id, fragment) {
    const element = document.getElementById(id);
    if (element) {
      element.outerHTML = fragment;
      return true;
    }
    return false;
  }

  function applyPatch(event) {
    const patch = JSON.parse(event.data);
    for (const [id, fragment] of Object.entries(patch.html || {})) {
      replace(id, fragment);
    }
    // Fork rows: a row the page does not have yet (a branch's new fork) is appended.
    const tbody = table.querySelector("tbody");
    for (const [id, fragment] of Object.entries(patch.rows || {})) {
      if (!replace(id, fragment) && tbody) {
        tbody.insertAdjacentHTML("beforeend", fragment);
      }
    }
    patches += 1;
    body.setAttribute("data-patches", String(patches));
  }

  function connect() {
    connects += 1;
    body.setAttribute("data-connects", String(connects));
    const source = new EventSource(url);
    body.setAttribute("data-live", "connecting");
    source.addEventListener("open", function () {
      // Counted here too: EventSource's own reconnects do not go through connect().
      opens += 1;
      body.setAttribute("data-opens", String(opens));
      body.setAttribute("data-live", "open");
    });
    source.addEventListener("patch", applyPatch);
    source.addEventListener("waiting", function () {
      // The watch ended before the run (the gateway restarting): the stream ends next
      // and EventSource connects again after the server's `retry:`.
      body.setAttribute("data-live", "reconnecting");
    });
    source.addEventListener("end", function () {
      // The run finished: nothing more will come, so no reconnect either.
      finished = true;
      source.close();
      body.setAttribute("data-live", "finished");
    });
    source.addEventListener("error", function () {
      if (finished) {
        return;
      }
      body.setAttribute("data-live", "reconnecting");
      // EventSource reconnects by itself after a stream that ended; an answer that is
      // not a stream (an error page) closes it for good, so connect anew, later.
      if (source.readyState === EventSource.CLOSED) {
        window.setTimeout(connect, 3000);
      }
    });
  }

  connect();
})();

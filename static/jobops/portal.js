/* jobops operator portal: panels that refresh themselves.
 *
 * <div data-refresh-url="..." data-refresh-seconds="5"> is replaced every few seconds by
 * what the URL answers (an HTML fragment). Refreshing pauses while the tab is hidden;
 * a failed refresh keeps the old figures and shows the element [data-stale-note].
 */
(function () {
  "use strict";

  function refresh(panel) {
    var url = panel.getAttribute("data-refresh-url");
    var note = document.querySelector("[data-stale-note]");
    return fetch(url, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (response.redirected || !response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        panel.innerHTML = html;
        if (note) { note.classList.remove("show"); }
        if (panel.querySelector("[data-reload-page]")) {
          // What the panel follows has ended: show the whole page as it is now.
          panel.removeAttribute("data-refresh-url");
          window.location.reload();
          return;
        }
        panel.dispatchEvent(new CustomEvent("portal:refreshed", { bubbles: true }));
      })
      .catch(function () {
        if (note) { note.classList.add("show"); }
      });
  }

  function start(panel) {
    var seconds = parseFloat(panel.getAttribute("data-refresh-seconds") || "5");
    var busy = false;
    window.setInterval(function () {
      if (busy || document.hidden || !panel.getAttribute("data-refresh-url")) { return; }
      busy = true;
      refresh(panel).then(function () { busy = false; });
    }, Math.max(1, seconds) * 1000);
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh-url]").forEach(start);
  });
})();

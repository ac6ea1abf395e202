/* jobops operator portal: panels that refresh themselves, and ids that copy.
 *
 * <div data-refresh-url="..." data-refresh-seconds="5"> is replaced every few seconds by
 * what the URL answers (an HTML fragment). Refreshing pauses while the tab is hidden;
 * a failed refresh keeps the old figures and shows the element [data-stale-note].
 *
 * <button class="copy-id" data-copy="..."> puts the whole id on the clipboard (lists
 * show only its end). Clicks are caught on the document, so buttons in a refreshed
 * panel work too.
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

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    // Plain http on another host has no clipboard API: the old way still works there.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    var done = document.execCommand("copy");
    document.body.removeChild(area);
    return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.copy-id");
    if (!button) { return; }
    event.preventDefault();
    copyText(button.getAttribute("data-copy")).then(function () {
      button.classList.add("copied");
      button.textContent = "copied";
      window.setTimeout(function () {
        button.classList.remove("copied");
        button.textContent = "copy";
      }, 1500);
    }, function () {
      window.prompt("Copy the id:", button.getAttribute("data-copy"));
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh-url]").forEach(start);
  });
})();

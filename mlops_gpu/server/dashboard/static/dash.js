// mlops-gpu dashboard: confirm before a cancel; refresh the page's figures in place every
// data-refresh seconds (fetch of the page itself, its <main id="live"> swapped in), paused
// while the tab is hidden. No inline script: the Content-Security-Policy allows only this file.
(function () {
  "use strict";
  document.addEventListener("submit", function (e) {
    var msg = e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) e.preventDefault();
  });
  var every = Number(document.body.getAttribute("data-refresh") || 0);
  if (!every) return;
  var busy = false;
  function stamp() {
    var el = document.getElementById("refreshed");
    if (el) el.textContent = "updated " + new Date().toLocaleTimeString();
  }
  function tick() {
    if (document.hidden || busy) return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (r) {
        // a session that ended meanwhile: the server sent the login page
        if (r.redirected || r.status === 401) { window.location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        var cur = document.getElementById("live");
        if (fresh && cur) { cur.replaceWith(document.importNode(fresh, true)); stamp(); }
      })
      .catch(function () { /* the next tick tries again */ })
      .then(function () { busy = false; });
  }
  stamp();
  window.setInterval(tick, every * 1000);
})();

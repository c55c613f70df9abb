// crdbwork dashboard: refreshes the page's live part without reloading.
// Every Refresh it asks the page's own address for its live part (the
// X-Crdbwork-Live header) and puts it in place, unless the user is
// selecting rows or typing in it. No framework, nothing from elsewhere.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  var every = parseInt(document.body.getAttribute("data-refresh"), 10) || 2000;
  var inflight = false;

  function busy() {
    var a = document.activeElement;
    if (a && live.contains(a) && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName)) return true;
    return live.querySelector('input[type="checkbox"]:checked') !== null;
  }

  function tick() {
    if (inflight || document.hidden || busy()) return;
    inflight = true;
    fetch(location.href, { headers: { "X-Crdbwork-Live": "1" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (!busy()) live.innerHTML = html;
        document.body.setAttribute("data-updated", String(Date.now()));
        if (status) { status.className = "ok"; status.title = "live: updated " + new Date().toLocaleTimeString(); }
      })
      .catch(function (e) {
        if (status) { status.className = "down"; status.title = "not updating: " + e.message; }
      })
      .then(function () { inflight = false; });
  }

  if (live && document.body.getAttribute("data-live") === "1") setInterval(tick, every);

  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t.hasAttribute && t.hasAttribute("data-select-all")) {
      var form = t.closest("form") || document;
      form.querySelectorAll('input[name="sel"]').forEach(function (c) { c.checked = t.checked; });
    }
  });
})();

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
        if (!busy()) { live.innerHTML = html; restoreCursor(); }
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

  // Keyboard shortcuts (the help overlay, #help in the page, lists them).
  // They move a cursor over the rows of the live part's tables that hold a
  // link, open a row, tick it, and press the page's own buttons: an action
  // goes through its confirmation page with its CSRF token, as a click.
  var help = document.getElementById("help");
  var cursorKey = null; // the row's data-id or data-queue, kept across refreshes
  var pending = ""; // "g" while a page jump waits for its letter

  function rows() {
    if (!live) return [];
    return Array.prototype.filter.call(live.querySelectorAll("tbody tr"), function (tr) {
      return tr.querySelector("a") !== null;
    });
  }
  function keyOf(tr) {
    return tr.getAttribute("data-id") || tr.getAttribute("data-queue") || tr.textContent;
  }
  function current() {
    return live ? live.querySelector("tr.cursor") : null;
  }
  function setCursor(tr) {
    var old = current();
    if (old) old.classList.remove("cursor");
    if (!tr) { cursorKey = null; return; }
    tr.classList.add("cursor");
    cursorKey = keyOf(tr);
    if (tr.scrollIntoView) tr.scrollIntoView({ block: "nearest" });
  }
  function restoreCursor() {
    if (cursorKey === null) return;
    var rs = rows();
    for (var i = 0; i < rs.length; i++) {
      if (keyOf(rs[i]) === cursorKey) { rs[i].classList.add("cursor"); return; }
    }
  }
  function move(by) {
    var rs = rows();
    if (rs.length === 0) return;
    var i = rs.indexOf(current());
    i = i < 0 ? (by > 0 ? 0 : rs.length - 1) : Math.max(0, Math.min(rs.length - 1, i + by));
    setCursor(rs[i]);
  }
  function showHelp(on) {
    if (!help) return;
    help.hidden = !on;
    document.body.setAttribute("data-help", on ? "1" : "");
  }
  function click(sel) {
    var e = document.querySelector(sel);
    if (e) { e.click(); return true; }
    return false;
  }
  function base() {
    var a = document.querySelector("header a.brand");
    return a ? a.getAttribute("href").replace(/\/$/, "") : "";
  }
  var jumps = { q: "/", s: "/sessions", i: "/items", d: "/items?state=dead", t: "/tenants", a: "/audit" };

  if (help) {
    help.addEventListener("click", function (e) { if (e.target === help) showHelp(false); });
  }
  var helpLink = document.getElementById("help-link");
  if (helpLink) helpLink.addEventListener("click", function (e) { e.preventDefault(); showHelp(help && help.hidden); });

  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    var t = e.target;
    var typing = t && /^(INPUT|SELECT|TEXTAREA)$/.test(t.tagName);
    if (e.key === "Escape") {
      if (help && !help.hidden) { showHelp(false); e.preventDefault(); return; }
      if (typing) { t.blur(); e.preventDefault(); }
      pending = "";
      return;
    }
    if (typing) return;
    if (help && !help.hidden && e.key !== "?") return;
    if (pending === "g") {
      pending = "";
      if (jumps[e.key]) { e.preventDefault(); location.href = base() + jumps[e.key]; }
      return;
    }
    var tr = current();
    switch (e.key) {
      case "?": showHelp(help && help.hidden); break;
      case "j": case "ArrowDown": if (e.key === "ArrowDown" && !tr) return; move(1); break;
      case "k": case "ArrowUp": if (e.key === "ArrowUp" && !tr) return; move(-1); break;
      case "Enter": case "o":
        if (!tr) return;
        var a = tr.querySelector('td[data-label="id"] a[href]') || tr.querySelector("td a[href]");
        if (a) location.href = a.href;
        break;
      case "x":
        if (!tr) return;
        var box = tr.querySelector('input[type="checkbox"][name="sel"]');
        if (box) box.checked = !box.checked;
        break;
      case "/":
        var f = document.querySelector("[data-shortcut='/'], main form.filter input:not([type=hidden])");
        if (!f) return;
        f.focus();
        if (f.select) f.select();
        break;
      case "n": if (!click('a#next, a[rel="next"]')) return; break;
      case "p": if (!click('a[rel="prev"]')) return; break;
      case "c": if (!click("#act-cancel-selected")) return; break;
      case "r": if (!click("#act-requeue-selected") && !click("#act-requeue-cancelled")) return; break;
      case "g": pending = "g"; break;
      default: return;
    }
    e.preventDefault();
  });
})();

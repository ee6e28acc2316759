// Shows every <time datetime="…Z"> in the clock the user chose in the header (<html data-clock>:
// "local", the browser's timezone, or "utc"); its title keeps the other one. Tells the server the
// browser's zone (a cookie) so the date filters and the admin read dates in it. Sizes the bars of
// the charts from their data-grow / data-left / data-width attributes, wires the "select all"
// checkbox of the dead-letter queue and the focus on a form's first error. Runs again on content
// htmx swaps in.
// The Content-Security-Policy allows no inline script, no on* attribute and no style attribute:
// pages put behaviour here and sizes in data attributes (set through the DOM, which CSP allows).
(function () {
  "use strict";
  var pad = function (n) { return String(n).padStart(2, "0"); };
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  var utc = document.documentElement.getAttribute("data-clock") === "utc";
  // IANA names (Europe/Berlin, America/Argentina/Buenos_Aires, Etc/GMT+2) need no quoting.
  if (/^[A-Za-z0-9_+\-\/]{1,64}$/.test(zone)) {
    document.cookie = "orchestrator_tz=" + zone + "; path=/; max-age=31536000; samesite=lax";
  }
  function parts(d, inUtc) {
    return inUtc
      ? [d.getUTCFullYear(), d.getUTCMonth() + 1, d.getUTCDate(), d.getUTCHours(), d.getUTCMinutes(), d.getUTCSeconds()]
      : [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(), d.getMinutes(), d.getSeconds()];
  }
  function text(d, inUtc) {
    var p = parts(d, inUtc), n = parts(new Date(), inUtc);
    var day = p[0] + "-" + pad(p[1]) + "-" + pad(p[2]);
    var time = pad(p[3]) + ":" + pad(p[4]) + ":" + pad(p[5]);
    return (p[0] === n[0] && p[1] === n[1] && p[2] === n[2] ? "today" : day) + " " + time;
  }
  function local(el) {
    var d = new Date(el.getAttribute("datetime"));
    if (isNaN(d)) return;
    if (el.hasAttribute("data-short")) {  // a grid column's date: month-day hour:minute, in the chosen clock
      var p = parts(d, utc);
      el.textContent = pad(p[1]) + "-" + pad(p[2]) + " " + pad(p[3]) + ":" + pad(p[4]);
      el.title = text(d, !utc) + (utc ? " " + (zone || "local time") : " UTC");
      el.classList.add(utc ? "utc" : "local");
      return;
    }
    el.textContent = text(d, utc) + (utc ? " UTC" : "");
    el.title = utc ? text(d, false) + " " + (zone || "local time") : text(d, true) + " UTC";
    el.classList.add(utc ? "utc" : "local");
  }
  function size(el) {
    var grow = el.getAttribute("data-grow"), left = el.getAttribute("data-left"),
        width = el.getAttribute("data-width");
    if (grow !== null) el.style.flexGrow = grow;
    if (left !== null) el.style.left = left + "%";
    if (width !== null) el.style.width = width + "%";
  }
  function refresh(root) {
    var scope = root.querySelectorAll ? root : document;
    scope.querySelectorAll("time[datetime]").forEach(local);
    scope.querySelectorAll("[data-grow], [data-left], [data-width]").forEach(size);
    if (scope.matches && scope.matches("[data-grow], [data-left], [data-width]")) size(scope);
  }
  document.addEventListener("DOMContentLoaded", function () {
    refresh(document);
    // A form answered with errors: the first wrong field gets the focus (and is announced with
    // its error through aria-describedby).
    var invalid = document.querySelector("[aria-invalid=true]");
    if (invalid) invalid.focus();
    document.querySelectorAll("[data-tz]").forEach(function (el) {
      el.textContent = utc ? "times in UTC" : "times in " + (zone || "local time");
    });
  });
  document.addEventListener("htmx:load", function (event) { refresh(event.target); });
  document.addEventListener("change", function (event) {
    var name = event.target.getAttribute && event.target.getAttribute("data-check-all");
    if (!name) return;
    var form = event.target.form;
    form.querySelectorAll('input[type=checkbox][name="' + name + '"]').forEach(function (box) {
      box.checked = event.target.checked;
    });
  });
})();

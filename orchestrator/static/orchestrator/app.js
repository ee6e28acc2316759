// Shows every <time datetime="…Z"> in the viewer's timezone (its title keeps UTC), and wires the
// "select all" checkbox of the dead-letter queue. Runs again on content htmx swaps in.
(function () {
  "use strict";
  var pad = function (n) { return String(n).padStart(2, "0"); };
  function local(el) {
    var d = new Date(el.getAttribute("datetime"));
    if (isNaN(d)) return;
    var now = new Date();
    var time = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    var day = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate());
    var today = now.getFullYear() + "-" + pad(now.getMonth() + 1) + "-" + pad(now.getDate());
    el.textContent = day === today ? "today " + time : day + " " + time;
    el.classList.add("local");
  }
  function refresh(root) {
    (root.querySelectorAll ? root : document).querySelectorAll("time[datetime]").forEach(local);
  }
  document.addEventListener("DOMContentLoaded", function () {
    refresh(document);
    // A form answered with errors: the first wrong field gets the focus (and is announced with
    // its error through aria-describedby).
    var invalid = document.querySelector("[aria-invalid=true]");
    if (invalid) invalid.focus();
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
    document.querySelectorAll("[data-tz]").forEach(function (el) { el.textContent = "times in " + zone; });
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

// The log of an attempt: search within it (case-insensitive, next and previous match, Enter and
// Shift+Enter in the box) and show only the lines of `logging` output at or above a level, or only
// the text the task printed (its own level, "stdout"). Lines come from the server as
// <span class="ln" data-level="…">. Works on the text the tail follower appends, too.
(function () {
  "use strict";
  var RANK = { debug: 10, info: 20, warning: 30, error: 40, critical: 50 };
  var found = [], current = -1;
  var canHighlight = typeof CSS !== "undefined" && CSS.highlights && typeof Highlight !== "undefined";

  function log() { return document.querySelector("pre.log"); }
  function el(id) { return document.getElementById(id); }

  function filter() {
    var pre = log(), choice = el("log-level");
    if (!pre || !choice) return;
    var printed = choice.value === "stdout", least = RANK[choice.value] || 0;
    pre.querySelectorAll(".ln").forEach(function (line) {
      var level = line.getAttribute("data-level") || "stdout";
      if (printed) line.hidden = level !== "stdout";
      else line.hidden = least > 0 && (level === "stdout" || (RANK[level] || 0) < least);
    });
  }

  function show() {
    var count = el("log-count");
    if (canHighlight) {
      CSS.highlights.set("log-match", new Highlight(...found));
      CSS.highlights.set("log-current", current >= 0 ? new Highlight(found[current]) : new Highlight());
    }
    if (count) {
      var needle = el("log-search") && el("log-search").value;
      count.textContent = !needle ? "" : found.length ? (current + 1) + " of " + found.length : "no match";
    }
    if (current >= 0) {
      var pre = log(), range = found[current];
      var box = pre.getBoundingClientRect(), at = range.getBoundingClientRect();
      pre.scrollTop += at.top - box.top - pre.clientHeight / 2;
      var mark = range.startContainer.parentElement;
      if (mark && mark.scrollIntoView) mark.scrollIntoView({ block: "nearest" });
    }
  }

  function search(keep) {
    var pre = log(), box = el("log-search");
    found = [];
    if (!pre || !box) return;
    var needle = box.value.toLowerCase();
    if (needle) {
      var walker = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT);
      for (var node = walker.nextNode(); node; node = walker.nextNode()) {
        var line = node.parentElement && node.parentElement.closest(".ln");
        if (line && line.hidden) continue;
        var hay = node.data.toLowerCase(), at = hay.indexOf(needle);
        while (at !== -1) {
          var range = document.createRange();
          range.setStart(node, at);
          range.setEnd(node, at + needle.length);
          found.push(range);
          at = hay.indexOf(needle, at + needle.length);
        }
      }
    }
    current = found.length ? (keep && current >= 0 ? Math.min(current, found.length - 1) : 0) : -1;
    show();
  }

  function step(by) {
    if (!found.length) return;
    current = (current + by + found.length) % found.length;
    show();
  }

  document.addEventListener("input", function (event) {
    if (event.target.id === "log-search") search(false);
  });
  document.addEventListener("change", function (event) {
    if (event.target.id === "log-level") { filter(); search(false); }
  });
  document.addEventListener("keydown", function (event) {
    if (event.target.id === "log-search" && event.key === "Enter") {
      event.preventDefault();
      step(event.shiftKey ? -1 : 1);
    }
  });
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("#log-next, #log-prev");
    if (button) step(button.id === "log-next" ? 1 : -1);
  });
  // Text the follower or "load more" appended: filter it and count its matches (the current
  // match stays where it was).
  document.addEventListener("htmx:load", function (event) {
    if (event.target.closest && event.target.closest("pre.log")) { filter(); search(true); }
  });
})();

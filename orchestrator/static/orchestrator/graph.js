// Pan and zoom for the task graph (svg.dag inside .dag-view): the buttons zoom in, out, to fit
// and to 100 %; Ctrl + wheel zooms at the pointer; dragging the background pans. The view is a
// scroll box, so the keyboard reaches every node link and the browser scrolls a focused one into
// view. The live updates replace the graph every few seconds: its zoom and scroll are kept.
(function () {
  "use strict";
  var MIN = 0.1, MAX = 3, STEP = 1.25;
  var kept = {};  // per page: {scale, left, top}

  function key() { return location.pathname; }
  function size(svg) {
    var box = svg.viewBox.baseVal;
    return { w: box.width, h: box.height };
  }
  function fitScale(view, svg) {
    var natural = size(svg), room = view.querySelector(".dag-scroll").clientWidth - 4;
    return Math.max(MIN, Math.min(1, room / natural.w));
  }
  function apply(view, scale, left, top) {
    var svg = view.querySelector("svg.dag"), scroll = view.querySelector(".dag-scroll");
    if (!svg || !scroll) return;
    var natural = size(svg);
    scale = Math.max(MIN, Math.min(MAX, scale));
    svg.setAttribute("width", Math.round(natural.w * scale));
    svg.setAttribute("height", Math.round(natural.h * scale));
    view.setAttribute("data-scale", scale.toFixed(3));
    var label = view.querySelector("[data-zoom-level]");
    if (label) label.textContent = Math.round(scale * 100) + " %";
    if (left !== undefined) { scroll.scrollLeft = left; scroll.scrollTop = top; }
    kept[key()] = { scale: scale, left: scroll.scrollLeft, top: scroll.scrollTop };
  }
  function scaleOf(view) { return parseFloat(view.getAttribute("data-scale")) || 1; }

  // Zoom keeping the point (x, y) of the scroll box where it is.
  function zoomAt(view, factor, x, y) {
    var scroll = view.querySelector(".dag-scroll"), old = scaleOf(view);
    var next = Math.max(MIN, Math.min(MAX, old * factor));
    if (x === undefined) { x = scroll.clientWidth / 2; y = scroll.clientHeight / 2; }
    var left = (scroll.scrollLeft + x) * next / old - x, top = (scroll.scrollTop + y) * next / old - y;
    apply(view, next, left, top);
  }

  function setUp(root) {
    (root.querySelectorAll ? root : document).querySelectorAll(".dag-view").forEach(function (view) {
      if (view.getAttribute("data-ready")) return;
      view.setAttribute("data-ready", "1");
      var svg = view.querySelector("svg.dag"), scroll = view.querySelector(".dag-scroll");
      if (!svg || !scroll) return;
      var state = kept[key()];
      if (state) apply(view, state.scale, state.left, state.top);
      else apply(view, size(svg).w > scroll.clientWidth ? fitScale(view, svg) : 1);
      scroll.addEventListener("scroll", function () {
        kept[key()] = { scale: scaleOf(view), left: scroll.scrollLeft, top: scroll.scrollTop };
      });
      scroll.addEventListener("wheel", function (event) {
        if (!event.ctrlKey) return;
        event.preventDefault();
        var box = scroll.getBoundingClientRect();
        zoomAt(view, event.deltaY < 0 ? STEP : 1 / STEP, event.clientX - box.left, event.clientY - box.top);
      }, { passive: false });
      var drag = null;
      scroll.addEventListener("pointerdown", function (event) {
        if (event.button !== 0 || event.target.closest("a")) return;
        drag = { x: event.clientX, y: event.clientY, left: scroll.scrollLeft, top: scroll.scrollTop };
        scroll.setPointerCapture(event.pointerId);
        scroll.classList.add("panning");
      });
      scroll.addEventListener("pointermove", function (event) {
        if (!drag) return;
        scroll.scrollLeft = drag.left - (event.clientX - drag.x);
        scroll.scrollTop = drag.top - (event.clientY - drag.y);
      });
      function stop() { drag = null; scroll.classList.remove("panning"); }
      scroll.addEventListener("pointerup", stop);
      scroll.addEventListener("pointercancel", stop);
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-zoom]");
    if (!button) return;
    var view = button.closest(".dag-view"), what = button.getAttribute("data-zoom");
    if (what === "in") zoomAt(view, STEP);
    else if (what === "out") zoomAt(view, 1 / STEP);
    else if (what === "fit") apply(view, fitScale(view, view.querySelector("svg.dag")), 0, 0);
    else apply(view, 1);
  });
  document.addEventListener("DOMContentLoaded", function () { setUp(document); });
  document.addEventListener("htmx:load", function (event) { setUp(event.target); });
  // A live update gives the focus back to the node that had it (htmx finds it by its id) without
  // scrolling, and the kept scroll may predate the browser's scroll to that node: bring it into
  // view again, as a keyboard user left it.
  document.addEventListener("htmx:afterSettle", function () {
    var active = document.activeElement;
    if (active && active.closest && active.closest("svg.dag")) active.scrollIntoView({ block: "nearest", inline: "nearest" });
  });
})();

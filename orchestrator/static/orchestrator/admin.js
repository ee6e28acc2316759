// The admin's tabular inlines (a task run's attempts) scroll sideways on a narrow screen: each
// such box is made a named region the keyboard can focus and scroll.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll(".inline-related.tabular div.wrapper").forEach(function (box) {
    if (box.scrollWidth <= box.clientWidth && box.scrollHeight <= box.clientHeight) { return; }
    var heading = box.closest(".inline-group") && box.closest(".inline-group").querySelector("h2");
    box.setAttribute("tabindex", "0");
    box.setAttribute("role", "region");
    box.setAttribute("aria-label", heading ? heading.textContent.trim() : "table");
  });
});

// Draws every chart of a page with the vendored vega-embed. Specs come from
// <script type="application/json"> elements; data never passes through innerHTML.
(function () {
  "use strict";
  function draw() {
    var charts = document.querySelectorAll("div.chart[data-spec]");
    Array.prototype.forEach.call(charts, function (el) {
      var spec = JSON.parse(document.getElementById(el.getAttribute("data-spec")).textContent);
      vegaEmbed(el, spec, { mode: "vega-lite", renderer: "svg", actions: false })
        .then(function () { el.setAttribute("data-drawn", "true"); })
        .catch(function (err) {
          el.setAttribute("data-drawn", "error");
          el.textContent = "This chart could not be drawn: " + err;
          console.error("chart " + el.id + ": " + err);
        });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();

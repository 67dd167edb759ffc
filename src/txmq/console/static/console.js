// txmq console: confirmation of changes, and the charts (drawn by uPlot, shipped beside this file).
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
  document.querySelectorAll("div.chart").forEach(function (div) {
    var params = new URLSearchParams({ series: div.dataset.series || "throughput" });
    if (div.dataset.group) params.set("group", div.dataset.group);
    fetch("/api/history?" + params.toString(), { credentials: "same-origin" })
      .then(function (r) { return r.json(); })
      .then(function (h) {
        var colors = ["#1f77b4", "#d62728", "#2ca02c"];
        var series = [{}].concat(h.labels.map(function (label, i) {
          return { label: label, stroke: colors[i % colors.length], width: 2 };
        }));
        if (h.data[0].length === 0) {
          div.insertAdjacentHTML("beforeend", '<p class="empty">no samples yet (one every few seconds)</p>');
        }
        new uPlot({ width: Math.max(400, div.clientWidth), height: 220, series: series }, h.data, div);
      });
  });
});

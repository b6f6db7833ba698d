// Zoom for the report's batch-age, token-age and heat-map charts: drag across a plot, click
// a bin, bar or column, or type a step range; Reset brings back the static chart.  A zoomed
// chart is redrawn (draw.js) from the per-step columns beside it (zoom.py).

// Per-step columns (zoom.py) --------------------------------------------------------

function sums(deltas) {
  var out = new Array(deltas.length), acc = 0;
  for (var i = 0; i < deltas.length; i++) out[i] = acc += deltas[i];
  return out;
}

function batchAge(d) {
  var ms = sums(d.ms), step = sums(d.step), runs = [], at = 0;
  d.n.forEach(function (n, r) {
    var pts = [];
    for (var i = at; i < at + n; i++) pts.push([ms[i] / 1000, d.age[i], step[i]]);
    runs.push({ name: d.runs[r], color: C.PALETTE[r % C.PALETTE.length], pts: pts });
    at += n;
  });
  return {
    keys: step,
    draw: function (a, b) {
      var series = runs.map(function (s) {
        return { name: s.name, color: s.color, pts: s.pts.filter(function (p) { return p[2] >= a && p[2] <= b; }) };
      });
      var secs = [];
      series.forEach(function (s) { s.pts.forEach(function (p) { secs.push(p[0]); }); });
      var lo = least(secs), hi = most(secs);
      var u = timeUnit(secs.length ? hi - lo : 0), unit = u[0];
      var when = function (x) { return isoUtc(d.t0 + x * unit); };
      series.forEach(function (s) {
        s.pts = s.pts.map(function (p) { return [p[0] / unit, p[1], p[2]]; });
      });
      var markers = d.markers.filter(function (m) { return m[0] >= lo && m[0] <= hi; })
        .map(function (m) { return [m[0] / unit, m[1], m[2]]; });
      var drawn = bandChart({
        title: d.title, series: series, markers: markers, xText: when, yLabel: d.y,
        xLabel: u[1] + " since " + isoUtc(d.t0),
        markerLegend: markers.length ? [["stop", "#d62728", "dash"], ["restore", "#2ca02c", "dash"]] : [],
        pointText: function (run, p) {
          return run + ", step " + grouped(p[2], 0) + " at " + when(p[0]) + ": batch age " + fixed(p[1], 2) + " updates";
        },
        binText: function (run, b) {
          return run + ", steps " + grouped(b.first, 0) + "–" + grouped(b.last, 0) + " (" + grouped(b.n, 0) +
            " steps) from " + when(b.lo) + " to " + when(b.hi) + ": batch age mean " + fixed(b.mean, 2) +
            ", p10 " + fixed(b.low, 2) + ", p90 " + fixed(b.high, 2) + " updates";
        }
      });
      if (drawn.axis) drawn.unit = unit;
      return drawn;
    },
    pick: function (v0, v1, view) { // the steps of the points between two x values
      var unit = view.unit || d.unit, found = [];
      runs.forEach(function (s) {
        s.pts.forEach(function (p) { if (p[0] >= v0 * unit && p[0] <= v1 * unit) found.push(p[2]); });
      });
      return found;
    }
  };
}

function byStep(d, rowsOf) {
  var keys = sums(d.step), rows = rowsOf(keys);
  return {
    keys: keys,
    rows: rows,
    pick: function (v0, v1, view) { // the steps whose bar or column the range crosses
      var w = view.width || 1;
      return keys.filter(function (k) {
        var left = w === 1 ? k - 0.5 : k - k % w;
        return left + w > v0 && left < v1;
      });
    },
    within: function (a, b) { return rows.filter(function (r) { return r[0] >= a && r[0] <= b; }); }
  };
}

function tokenAge(d) {
  var n = C.AGE_LABELS.length, chart = byStep(d, function (keys) {
    return keys.map(function (k, i) { return [k, d.tokens.slice(i * n, i * n + n)]; });
  });
  chart.draw = function (a, b) { return stackedBars(d, chart.within(a, b)); };
  chart.full = keyWidth(chart.keys[0], chart.keys[chart.keys.length - 1], chart.keys.length, C.MAX_BINS);
  return chart;
}

function ageHeatmap(d) {
  var chart = byStep(d, function (keys) {
    var at = 0;
    return keys.map(function (k, i) {
      var cells = [];
      for (var j = at; j < at + d.n[i]; j++) cells.push([d.age[j], d.tokens[j]]);
      at += d.n[i];
      return [k, cells];
    });
  });
  chart.draw = function (a, b) { return heatMap(d, chart.within(a, b)); };
  chart.full = keyWidth(chart.keys[0], chart.keys[chart.keys.length - 1], chart.keys.length, C.MAX_BINS / 2 | 0);
  return chart;
}

// Controls --------------------------------------------------------------------------

var KINDS = { "batch-age": batchAge, "token-age": tokenAge, "age-heatmap": ageHeatmap };

function Zoom(svg, d) {
  var self = this, chart = KINDS[svg.id](d), original = svg.innerHTML;
  var first = least(chart.keys), last = most(chart.keys);
  var view = { width: chart.full, unit: d.unit }, drag = null, sel = null;
  var box = document.createElement("div");
  box.className = "zoom";
  box.innerHTML = '<label>steps <input type="number" class="zoom-from" step="1"> to ' +
    '<input type="number" class="zoom-to" step="1"></label> <button type="button" class="zoom-go">Zoom</button> ' +
    '<button type="button" class="zoom-reset">Reset</button> <span class="muted">or drag across the plot, ' +
    "or click a bin, to zoom to its steps</span>";
  svg.parentNode.insertBefore(box, svg.nextSibling);
  var from = box.querySelector(".zoom-from"), to = box.querySelector(".zoom-to");
  from.value = first; to.value = last;
  svg.classList.add("zoomable");

  self.zoomTo = function (a, b) {
    a = Math.round(+a); b = Math.round(+b);
    if (!isFinite(a) || !isFinite(b)) return false;
    if (a > b) { var t = a; a = b; b = t; }
    var drawn = chart.draw(a, b);
    if (typeof drawn === "string") { svg.innerHTML = drawn; view = {}; } else {
      svg.innerHTML = drawn.svg;
      view = { width: drawn.width, unit: drawn.unit };
    }
    svg.setAttribute("data-zoom", a + " " + b);
    from.value = a; to.value = b;
    return true;
  };
  self.reset = function () {
    svg.innerHTML = original;
    svg.removeAttribute("data-zoom");
    view = { width: chart.full, unit: d.unit };
    from.value = first; to.value = last;
  };
  box.querySelector(".zoom-go").addEventListener("click", function () { self.zoomTo(from.value, to.value); });
  box.querySelector(".zoom-reset").addEventListener("click", self.reset);
  [from, to].forEach(function (input) {
    input.addEventListener("keydown", function (e) { if (e.key === "Enter") self.zoomTo(from.value, to.value); });
  });

  function local(e) { // a mouse position in the chart's own units (its viewBox)
    var m = svg.getScreenCTM(), p = new DOMPoint(e.clientX, e.clientY).matrixTransform(m.inverse());
    return p;
  }
  function domain() {
    var plot = svg.querySelector("rect.plot"), x = plot && plot.getAttribute("data-x");
    return x ? x.split(" ").map(Number) : null;
  }
  svg.addEventListener("mousedown", function (e) {
    var p = local(e);
    if (e.button !== 0 || p.x < C.X0 || p.x > C.X1 || p.y < C.Y0 || p.y > C.Y1) return;
    e.preventDefault();
    drag = { x0: p.x, x1: p.x, target: e.target };
    sel = document.createElementNS("http://www.w3.org/2000/svg", "rect");
    sel.setAttribute("class", "zoom-sel");
    sel.setAttribute("y", C.Y0);
    sel.setAttribute("height", C.Y1 - C.Y0);
    svg.appendChild(sel);
  });
  document.addEventListener("mousemove", function (e) {
    if (!drag) return;
    drag.x1 = Math.min(Math.max(local(e).x, C.X0), C.X1);
    sel.setAttribute("x", Math.min(drag.x0, drag.x1));
    sel.setAttribute("width", Math.abs(drag.x1 - drag.x0));
  });
  document.addEventListener("mouseup", function () {
    if (!drag) return;
    var done = drag, span = Math.abs(done.x1 - done.x0);
    drag = null;
    if (sel.parentNode) sel.parentNode.removeChild(sel);
    if (span < 3) { // a click: the bin, bar or column under it
      var hit = done.target.closest && done.target.closest("[data-steps]");
      if (hit) { var s = hit.getAttribute("data-steps").split(" "); self.zoomTo(s[0], s[1]); }
      return;
    }
    var dom = domain();
    if (!dom) return;
    var val = function (x) { return dom[0] + (x - C.X0) * (dom[1] - dom[0]) / (C.X1 - C.X0); };
    var found = chart.pick(val(Math.min(done.x0, done.x1)), val(Math.max(done.x0, done.x1)), view);
    if (found.length) self.zoomTo(least(found), most(found));
  });
}

function start() {
  var config = document.getElementById("zoom-config");
  if (!config) return;
  C = JSON.parse(config.textContent);
  var api = window.otelRollout = {
    rules: { niceStep: niceStep, niceTicks: niceTicks, tickLabel: tickLabel, axisOf: axisOf,
             binEdges: binEdges, keyWidth: keyWidth, timeUnit: timeUnit, heatColor: heatColor,
             fixed: fixed, isoUtc: isoUtc },
    zoom: {}
  };
  var tags = document.querySelectorAll('script.zoom-data');
  for (var i = 0; i < tags.length; i++) {
    var id = tags[i].getAttribute("data-for"), svg = document.getElementById(id);
    var d = JSON.parse(tags[i].textContent);
    if (svg && (d.step || []).length) api.zoom[id] = new Zoom(svg, d);
  }
}
document.addEventListener("DOMContentLoaded", start);

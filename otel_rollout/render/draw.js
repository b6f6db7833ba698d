// The report's zoomable charts drawn in the browser: the rules of scale.py, the frame of
// frame.py and the band chart, bars and heat map of svg.py, written a second time for the
// zoom (zoom.js).  tests/test_report_zoom.py checks both give the same ticks, labels, bins
// and marks.  zoom.py wraps this file and zoom.js in one function: C is the config it
// reads (zoom.py's config_tag).
var C = null;

// Rules: twins of scale.py ----------------------------------------------------------

function pow10(e) { return Number("1e" + e); } // correctly rounded, as Python's 10 ** e

function niceStep(span, count) {
  if (!isFinite(span) || span <= 0) return 1;
  var raw = span / Math.max(count, 1);
  var power = pow10(Math.floor(Math.log10(raw)));
  var ms = [1, 2, 2.5, 5, 10];
  for (var i = 0; i < ms.length; i++) if (raw <= ms[i] * power) return ms[i] * power;
  return 10 * power;
}

function niceTicks(lo, hi, count, minStep) {
  if (!(isFinite(lo) && isFinite(hi))) { lo = 0; hi = 1; }
  if (hi <= lo) { if (lo) { lo = lo - 1; hi = hi + 1; } else { lo = 0; hi = 1; } }
  var step = Math.max(niceStep(hi - lo, count), minStep || 0);
  var first = Math.floor(lo / step + 1e-9), last = Math.ceil(hi / step - 1e-9), ticks = [];
  for (var n = first; n <= last; n++) ticks.push(n * step);
  return { ticks: ticks, step: step };
}

// Python's f"{v:.{d}f}": the exact binary value rounded half to even.
function fixed(v, d) {
  if (!isFinite(v)) return isNaN(v) ? "nan" : v > 0 ? "inf" : "-inf";
  var neg = v < 0 || (v === 0 && 1 / v < 0), a = Math.abs(v);
  if (a >= 1e21) return (neg ? "-" : "") + BigInt(a).toString() + (d ? "." + "0".repeat(d) : "");
  var parts = a.toFixed(100).split("."), digits = parts[0] + parts[1].slice(0, d);
  var rest = parts[1].slice(d), up = rest[0] > "5";
  if (rest[0] === "5") up = /[1-9]/.test(rest.slice(1)) || (digits.charCodeAt(digits.length - 1) & 1) === 1;
  if (up) {
    var out = digits.split(""), i = out.length - 1;
    while (i >= 0 && out[i] === "9") out[i--] = "0";
    if (i >= 0) out[i] = String(+out[i] + 1); else out.unshift("1");
    digits = out.join("");
  }
  var cut = digits.length - d, whole = digits.slice(0, cut), frac = digits.slice(cut);
  return (neg ? "-" : "") + whole + (d ? "." + frac : "");
}

function grouped(v, d) { // Python's f"{v:,.{d}f}"
  var s = fixed(v, d), sign = s[0] === "-" ? "-" : "", body = sign ? s.slice(1) : s;
  var parts = body.split("."), whole = parts[0].replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return sign + whole + (parts.length > 1 ? "." + parts[1] : "");
}

function pct(share) { return fixed(share * 100, 1) + "%"; } // f"{share:.1%}"

function tickLabel(value, step) {
  var d = 0;
  while (d < 12 && Math.abs(step * pow10(d) - Math.round(step * pow10(d))) > 1e-6) d++;
  var text = grouped(value, d);
  return text.replace(/[-0.,]/g, "") === "" ? "0" : text;
}

function axisOf(lo, hi, a, b, count, tight, minStep) {
  var t = niceTicks(lo, hi, count, minStep), ax;
  if (!tight || hi <= lo) {
    ax = { ticks: t.ticks, step: t.step, lo: t.ticks[0], hi: t.ticks[t.ticks.length - 1] };
  } else {
    var inside = t.ticks.filter(function (v) {
      return lo - 1e-9 * t.step <= v && v <= hi + 1e-9 * t.step;
    });
    ax = { ticks: inside.length ? inside : t.ticks, step: t.step, lo: lo, hi: hi };
  }
  ax.a = a; ax.b = b;
  ax.at = function (v) { return a + (v - ax.lo) * (b - a) / ((ax.hi - ax.lo) || 1); };
  return ax;
}

function binEdges(lo, hi, bins) {
  var width = niceStep(hi - lo, bins);
  while ((hi - lo) / width >= bins) width = niceStep(width * 1.01 * bins, bins);
  var start = Math.floor(lo / width) * width;
  var count = Math.max(1, Math.ceil((hi - start) / width + 1e-9)), edges = [];
  if (start + count * width <= hi) count += 1;
  for (var k = 0; k <= count; k++) edges.push(start + k * width);
  return edges;
}

function keyWidth(k0, k1, count, limit) {
  if (count <= limit) return 1;
  var width = Math.max(1, Math.ceil(niceStep(k1 - k0 + 1, limit)));
  while ((k1 - k0 + 1) / width > limit) width = Math.ceil(niceStep(width * 1.01 * limit, limit));
  return width;
}

function timeUnit(span) {
  for (var i = 0; i < C.UNITS.length; i++) if (span <= C.UNITS[i][0]) return C.UNITS[i].slice(1);
  return [86400, "days"];
}

function roundEven(x) {
  var r = Math.round(x);
  return Math.abs(x % 1) === 0.5 ? 2 * Math.round(x / 2) : r;
}

function heatColor(share) {
  share = Math.min(Math.max(share, 0), 1) * (C.HEAT.length - 1);
  var i = Math.min(Math.floor(share), C.HEAT.length - 2), f = share - i, out = "#";
  for (var j = 1; j < 7; j += 2) {
    var a = parseInt(C.HEAT[i].slice(j, j + 2), 16), b = parseInt(C.HEAT[i + 1].slice(j, j + 2), 16);
    out += ("0" + roundEven(a * (1 - f) + b * f).toString(16)).slice(-2);
  }
  return out;
}

// The least and most of an array (Math.min.apply fails past ~100k values).
function least(a) { var m = Infinity; for (var i = 0; i < a.length; i++) if (a[i] < m) m = a[i]; return m; }
function most(a) { var m = -Infinity; for (var i = 0; i < a.length; i++) if (a[i] > m) m = a[i]; return m; }

function quantile(sorted, q) { return sorted[Math.max(0, Math.ceil(q * sorted.length) - 1)]; }

function binPoints(points, edges) { // points x-sorted [x, y, key]; the p10-p90 band
  var out = [], i = 0, n = points.length, end = edges[edges.length - 1];
  for (var e = 0; e + 1 < edges.length; e++) {
    var lo = edges[e], hi = edges[e + 1], chunk = [];
    while (i < n && (points[i][0] < hi || hi === end)) chunk.push(points[i++]);
    if (!chunk.length) continue;
    var ys = chunk.map(function (p) { return p[1]; }).sort(function (a, b) { return a - b; });
    var sum = 0;
    for (var k = 0; k < ys.length; k++) sum += ys[k];
    out.push({ lo: lo, hi: hi, n: ys.length, mean: sum / ys.length, low: quantile(ys, 0.1),
               high: quantile(ys, 0.9), first: chunk[0][2], last: chunk[chunk.length - 1][2] });
  }
  return out;
}

function isoUtc(t) {
  var date = new Date(Math.floor(Math.round(t * 1e6) / 1000));
  return isNaN(date.getTime()) ? fixed(t, 3) + " (epoch s)" : date.toISOString();
}

// Frame: twin of frame.py ----------------------------------------------------------

function esc(s) {
  return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#x27;");
}

function f1(v) { return fixed(v, 1); }

function legend(items) {
  var x = C.X1 + 14, out = ['<g class="legend">'];
  if (items.length > C.LEGEND_ROWS) {
    var hidden = items.length - C.LEGEND_ROWS + 1;
    items = items.slice(0, C.LEGEND_ROWS - 1).concat([["… and " + hidden + " more", "", "head"]]);
  }
  items.forEach(function (item, n) {
    var yy = C.Y0 + 4 + 17 * n, label = item[0], color = item[1], kind = item[2] || "box";
    if (kind === "head") {
      out.push('<text class="legend head" x="' + x + '" y="' + (yy + 9) + '">' + esc(label) + "</text>");
      return;
    }
    if (kind === "line") {
      out.push('<line class="swatch" x1="' + x + '" y1="' + (yy + 5) + '" x2="' + (x + 16) + '" y2="' +
        (yy + 5) + '" stroke="' + color + '" stroke-width="2.5"/>');
    } else if (kind === "dash") {
      out.push('<line class="swatch" x1="' + (x + 8) + '" y1="' + (yy - 1) + '" x2="' + (x + 8) +
        '" y2="' + (yy + 11) + '" stroke="' + color + '" stroke-width="2" stroke-dasharray="3 2"/>');
    } else {
      out.push('<rect class="swatch" x="' + x + '" y="' + yy + '" width="16" height="10" fill="' + color +
        '"' + (kind === "band" ? ' fill-opacity="0.3"' : "") + "/>");
    }
    var tip = label.length > C.LEGEND_CHARS ? "<title>" + esc(label) + "</title>" : "";
    if (tip) label = label.slice(0, C.LEGEND_CHARS - 1) + "…";
    out.push('<text class="legend" x="' + (x + 22) + '" y="' + (yy + 9) + '">' + esc(label) + tip + "</text>");
  });
  out.push("</g>");
  return out;
}

function grid(xa, ya) {
  var out = ['<rect class="plot" x="' + C.X0 + '" y="' + C.Y0 + '" width="' + (C.X1 - C.X0) +
    '" height="' + (C.Y1 - C.Y0) + '" fill="none" stroke="#999"' +
    (xa ? ' data-x="' + xa.lo + " " + xa.hi + '"' : "") + "/>"];
  if (ya) ya.ticks.forEach(function (v) {
    var y = f1(ya.at(v));
    out.push('<line x1="' + C.X0 + '" y1="' + y + '" x2="' + C.X1 + '" y2="' + y + '" class="grid"/>' +
      '<text x="' + (C.X0 - 6) + '" y="' + f1(ya.at(v) + 4) + '" text-anchor="end" class="tick">' +
      tickLabel(v, ya.step) + "</text>");
  });
  if (xa) xa.ticks.forEach(function (v) {
    var x = f1(xa.at(v));
    out.push('<line x1="' + x + '" y1="' + C.Y1 + '" x2="' + x + '" y2="' + (C.Y1 + 4) +
      '" stroke="#666"/><text x="' + x + '" y="' + (C.Y1 + 16) +
      '" text-anchor="middle" class="tick">' + esc(tickLabel(v, xa.step)) + "</text>");
  });
  return out;
}

function frame(title, body, xLabel, yLabel) { // the inside of frame.chart's <svg>
  var midY = (C.Y0 + C.Y1) / 2;
  return "<title>" + esc(title) + '</title><rect x="0" y="0" width="' + C.W + '" height="' + C.H +
    '" fill="white"/><text x="' + C.X0 + '" y="20" class="title">' + esc(title) + "</text>" +
    body.join("") + '<text x="' + (C.X0 + C.X1) / 2 + '" y="' + (C.H - 8) +
    '" text-anchor="middle" class="axis">' + esc(xLabel) + '</text><text x="14" y="' + midY +
    '" transform="rotate(-90 14 ' + midY + ')" text-anchor="middle" class="axis">' + esc(yLabel) + "</text>";
}

function empty(title, xLabel, yLabel) {
  return frame(title, ['<text x="' + (C.X0 + C.X1) / 2 + '" y="' + C.H / 2 +
    '" text-anchor="middle" class="empty">no data</text>'], xLabel, yLabel);
}

function steps(first, last) { return ' data-steps="' + first + " " + last + '"'; }

// Charts: twins of svg.py's band_chart, stacked_bars and heat_map ----------------------

function bandChart(o) { // o: title, series [{name, color, pts}], markers, xLabel, yLabel ...
  var all = [];
  o.series.forEach(function (s) { all = all.concat(s.pts); });
  if (!all.length) return empty(o.title, o.xLabel, o.yLabel);
  var xs = all.map(function (p) { return p[0]; }), ys = all.map(function (p) { return p[1]; });
  var xMin = least(xs), xMax = most(xs);
  o.markers.forEach(function (m) { xMin = Math.min(xMin, m[0]); xMax = Math.max(xMax, m[0]); });
  var raw = all.length <= C.RAW_LIMIT, xa = axisOf(xMin, xMax, C.X0, C.X1, 6, true, 0);
  var edges = raw ? [] : binEdges(xMin, xMax, C.MAX_BINS), yTop = most(ys);
  var ya = axisOf(Math.min(0, least(ys)), yTop || 1, C.Y1, C.Y0, 5, false, 0);
  var body = grid(xa, ya), items = [];
  o.markers.forEach(function (m) {
    var x = f1(xa.at(m[0]));
    body.push('<line class="marker" x1="' + x + '" y1="' + C.Y0 + '" x2="' + x + '" y2="' + C.Y1 +
      '" stroke="' + m[2] + '" stroke-width="1.5" stroke-dasharray="4 3"><title>' +
      esc(m[1] + " at " + o.xText(m[0])) + "</title></line>");
  });
  o.series.forEach(function (s) {
    var pts = s.pts.slice().sort(function (a, b) { return a[0] - b[0]; });
    items.push([s.name, s.color, "line"]);
    if (raw) {
      var coords = pts.map(function (p) { return f1(xa.at(p[0])) + "," + f1(ya.at(p[1])); });
      body.push('<polyline class="mark series" fill="none" stroke="' + s.color +
        '" stroke-width="1.6" points="' + coords.join(" ") + '"/>');
      pts.forEach(function (p) {
        body.push('<circle class="mark pt" cx="' + f1(xa.at(p[0])) + '" cy="' + f1(ya.at(p[1])) +
          '" r="2.6" fill="' + s.color + '"><title>' + esc(o.pointText(s.name, p)) + "</title></circle>");
      });
      return;
    }
    var bins = binPoints(pts, edges), runs = [];
    bins.forEach(function (b) {
      var last = runs.length ? runs[runs.length - 1] : null;
      if (last && Math.abs(last[last.length - 1].hi - b.lo) < 1e-9 * Math.max(1, Math.abs(b.lo))) last.push(b);
      else runs.push([b]);
    });
    runs.forEach(function (run) {
      var mids = run.map(function (b) { return [xa.at((b.lo + b.hi) / 2), b]; });
      if (run.length === 1) mids = [[xa.at(run[0].lo), run[0]], [xa.at(run[0].hi), run[0]]];
      var upper = mids.map(function (m) { return f1(m[0]) + "," + f1(ya.at(m[1].high)); });
      var lower = mids.slice().reverse().map(function (m) { return f1(m[0]) + "," + f1(ya.at(m[1].low)); });
      body.push('<path class="mark band" d="M' + upper.join(" L") + " L" + lower.join(" L") +
        ' Z" fill="' + s.color + '" fill-opacity="0.22" stroke="none"/>');
      body.push('<polyline class="mark series" fill="none" stroke="' + s.color +
        '" stroke-width="1.6" points="' + mids.map(function (m) {
          return f1(m[0]) + "," + f1(ya.at(m[1].mean));
        }).join(" ") + '"/>');
    });
    bins.forEach(function (b) {
      var x0 = xa.at(b.lo), x1 = xa.at(b.hi);
      body.push('<rect class="mark hover" x="' + f1(x0) + '" y="' + C.Y0 + '" width="' +
        f1(Math.max(x1 - x0, 0.8)) + '" height="' + (C.Y1 - C.Y0) + '" fill="transparent"' +
        steps(b.first, b.last) + "><title>" + esc(o.binText(s.name, b)) + "</title></rect>");
    });
  });
  if (!raw) items.push(["p10–p90 band", "#888", "band"]);
  body = body.concat(legend(items.concat(o.markerLegend)));
  return { svg: frame(o.title, body, o.xLabel, o.yLabel), axis: xa };
}

function keyAxis(k0, k1, width) {
  if (width === 1) return axisOf(k0 - 0.5, k1 + 0.5, C.X0, C.X1, 6, true, 0);
  return axisOf(k0 - k0 % width, k1 - k1 % width + width, C.X0, C.X1, 6, true, 0);
}

function span(width, start, last) {
  return width === 1 ? "step " + grouped(start, 0) : "steps " + grouped(start, 0) + "–" + grouped(last, 0);
}

function stackedBars(o, rows) { // rows [[step, [counts]]] in step order, none empty
  if (!rows.length) return empty(o.title, o.x, o.y);
  var k0 = rows[0][0], k1 = rows[rows.length - 1][0], width = keyWidth(k0, k1, rows.length, C.MAX_BINS);
  var bars = [];
  rows.forEach(function (r) {
    var start = width > 1 ? r[0] - r[0] % width : r[0], last = bars[bars.length - 1];
    if (last && last[0] === start) {
      last[1] = r[0];
      last[2] = last[2].map(function (c, i) { return c + r[1][i]; });
    } else bars.push([start, r[0], r[1].slice()]);
  });
  var xa = keyAxis(k0, k1, width), ya = axisOf(0, 100, C.Y1, C.Y0, 4, false, 0), body = grid(xa, ya);
  var px = Math.abs(xa.at(width) - xa.at(0)), gap = px > 2 ? Math.min(px * 0.15, 1) : 0;
  bars.forEach(function (bar) {
    var counts = bar[2], total = counts.reduce(function (a, b) { return a + b; }, 0);
    var left = xa.at(width === 1 ? bar[0] - 0.5 : bar[0]), base = 0;
    var shares = counts.map(function (c) { return c / total; });
    var tip = span(width, bar[0], bar[1]) + ": " + grouped(total, 0) + " tokens; " +
      shares.map(function (s, i) { return C.AGE_LABELS[i] + " " + pct(s); }).join(", ");
    shares.forEach(function (share, i) {
      if (share <= 0) return;
      var top = base + share * 100;
      body.push('<rect class="mark bar" x="' + f1(left + gap / 2) + '" y="' + f1(ya.at(top)) +
        '" width="' + f1(Math.max(px - gap, 0.6)) + '" height="' + f1(ya.at(base) - ya.at(top)) +
        '" fill="' + C.AGE_COLORS[i] + '"' + steps(bar[0], bar[1]) + "><title>" + esc(tip) + "</title></rect>");
      base = top;
    });
  });
  body = body.concat(legend(C.AGE_LABELS.map(function (l, i) { return [l, C.AGE_COLORS[i]]; })));
  var xLabel = o.x + (width > 1 ? " (bars of " + grouped(width, 0) + " steps)" : "");
  return { svg: frame(o.title, body, xLabel, o.y), axis: xa, width: width };
}

function heatMap(o, columns) { // columns [[step, [[age, tokens] ...]]] in step order
  if (!columns.length) return empty(o.title, o.x, o.y);
  var maxRows = C.HEAT_ROWS, topAge = 0;
  columns.forEach(function (c) { c[1].forEach(function (p) { topAge = Math.max(topAge, p[0]); }); });
  topAge = Math.min(topAge, maxRows - 1);
  var k0 = columns[0][0], k1 = columns[columns.length - 1][0];
  var width = keyWidth(k0, k1, columns.length, C.MAX_BINS / 2 | 0), cols = [];
  columns.forEach(function (c) {
    var start = width > 1 ? c[0] - c[0] % width : c[0], last = cols[cols.length - 1];
    if (!last || last[0] !== start) cols.push(last = [start, c[0], {}]);
    last[1] = c[0];
    c[1].forEach(function (p) { var row = Math.min(p[0], topAge); last[2][row] = (last[2][row] || 0) + p[1]; });
  });
  var xa = keyAxis(k0, k1, width), rows = topAge + 1, cellH = (C.Y1 - C.Y0) / rows, body = grid(xa, null);
  var top = topAge === maxRows - 1;
  for (var r = 0; r < rows; r++) {
    body.push('<text x="' + (C.X0 - 6) + '" y="' + f1(C.Y1 - (r + 0.5) * cellH + 4) +
      '" text-anchor="end" class="tick">' + (r === topAge && top ? r + "+" : String(r)) + "</text>");
  }
  var px = Math.abs(xa.at(width) - xa.at(0));
  cols.forEach(function (col) {
    var ages = Object.keys(col[2]).map(Number).sort(function (a, b) { return a - b; });
    var total = ages.reduce(function (s, a) { return s + col[2][a]; }, 0);
    var left = xa.at(width === 1 ? col[0] - 0.5 : col[0]), where = span(width, col[0], col[1]);
    ages.forEach(function (age) {
      var n = col[2][age], share = n / total;
      var tip = where + ", age " + age + (age === topAge && top ? "+" : "") + ": " + pct(share) +
        " of " + grouped(total, 0) + " tokens (" + grouped(n, 0) + ")";
      body.push('<rect class="mark cell" x="' + f1(left) + '" y="' + f1(C.Y1 - (age + 1) * cellH) +
        '" width="' + f1(Math.max(px, 0.6)) + '" height="' + f1(cellH) + '" fill="' + heatColor(share) +
        '"' + steps(col[0], col[1]) + "><title>" + esc(tip) + "</title></rect>");
    });
  });
  var items = [["share of tokens", "", "head"]];
  [0, 0.25, 0.5, 0.75, 1].forEach(function (q) { items.push([fixed(q * 100, 0) + "%", heatColor(q)]); });
  body = body.concat(legend(items));
  var xLabel = o.x + (width > 1 ? " (columns of " + grouped(width, 0) + " steps)" : "");
  return { svg: frame(o.title, body, xLabel, o.y), axis: xa, width: width };
}

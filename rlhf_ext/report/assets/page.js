
(function () {
  var blob = JSON.parse(document.getElementById("rlhf-report-data").textContent);
  function decode(b64) {
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float32Array(bytes.buffer);
  }
  var stepX = {}, stepNum = {}, knots = {}, stepTicks = {};
  // budget axes: a run's cumulative samples / tokens at a step, linear between the stored knots
  function toBudget(run, mode, steps) {
    var out = new Array(steps.length);
    if (!run || !run[mode]) { for (var i = 0; i < steps.length; i++) out[i] = NaN; return out; }
    var key = run.name + "/" + mode;
    if (!knots[key]) knots[key] = [decode(run[mode].steps), decode(run[mode].values)];
    var xs = knots[key][0], ys = knots[key][1];
    for (var i = 0; i < steps.length; i++) {
      var s = steps[i], lo = 0, hi = xs.length - 1;
      if (s <= xs[0]) { out[i] = s === xs[0] ? ys[0] : NaN; continue; }
      if (s >= xs[hi]) { out[i] = s === xs[hi] ? ys[hi] : NaN; continue; }
      while (hi - lo > 1) { var mid = (lo + hi) >> 1; if (xs[mid] <= s) lo = mid; else hi = mid; }
      out[i] = ys[lo] + (ys[hi] - ys[lo]) * (s - xs[lo]) / (xs[hi] - xs[lo]);
    }
    return out;
  }
  function setX(mode) {
    blob.dynamics.forEach(function (id) {
      var gd = document.getElementById(id);
      if (!gd || !gd.data) return;
      if (!stepX[id]) {
        stepX[id] = gd.data.map(function (t) { return t.x; });
        // the decoded step values (plotly keeps t.x base64-encoded), read before any switch
        stepNum[id] = gd._fullData.map(function (t) { return Array.from(t.x || []); });
      }
      var budget = mode === "samples" || mode === "tokens";
      var xs = gd.data.map(function (t, i) {
        if (mode === "wall") return t.customdata;
        if (budget) return toBudget(blob.budget[t.legendgroup], mode, stepNum[id][i]);
        return stepX[id][i];
      });
      Plotly.restyle(gd, {x: xs});
      var title = mode === "wall" ? blob.wallLabel : (budget ? blob.budgetLabels[mode] : "step");
      var axis = {"xaxis.title.text": title, "xaxis.autorange": true};
      // steps are integers: the step axis keeps its integer tick spacing (figures.step_axis); others are auto
      if (!stepTicks[id]) stepTicks[id] = gd.layout.xaxis.dtick;
      axis["xaxis.tickmode"] = mode === "step" ? "linear" : "auto";
      if (mode === "step") axis["xaxis.dtick"] = stepTicks[id];
      Plotly.relayout(gd, axis);
    });
    document.body.setAttribute("data-xaxis", mode);
  }
  function setWindow(w) {
    Object.keys(blob.smoothing).forEach(function (id) {
      var gd = document.getElementById(id), fig = blob.smoothing[id];
      if (!gd || !gd.data || !fig.traces.length) return;
      Plotly.restyle(gd, {y: fig.ys[w].map(decode)}, fig.traces);
    });
    document.body.setAttribute("data-window", w);
  }
  // zoomed on the step axis: an integer spacing again for the new range (as figures.step_dtick)
  function integerTicks(gd) {
    gd.on("plotly_relayout", function (ev) {
      if (document.body.getAttribute("data-xaxis") !== "step" || ev["xaxis.dtick"] !== undefined) return;
      var r = gd.layout.xaxis.range, raw = Math.max(r[1] - r[0], 1) / 8, d = 1;
      if (raw > 1) {
        var mag = Math.pow(10, Math.floor(Math.log10(raw)));
        d = [1, 2, 5, 10].map(function (m) { return m * mag; }).filter(function (v) { return v >= raw; })[0];
      }
      if (gd.layout.xaxis.dtick !== d) Plotly.relayout(gd, {"xaxis.tickmode": "linear", "xaxis.dtick": d});
    });
  }
  blob.dynamics.forEach(function (id) {
    var gd = document.getElementById(id);
    if (gd && gd.on) integerTicks(gd);
  });
  document.getElementById("xaxis").addEventListener("change", function (e) { setX(e.target.value); });
  document.getElementById("window").addEventListener("change", function (e) { setWindow(e.target.value); });
  window.rlhfReport = {setX: setX, setWindow: setWindow};
})();

"""The report's sample viewer, page side: its section, style and script (data: :mod:`.samples`).

Pick a view (a run's step or an evaluation's task), filter by reward range and truncation, and
optionally a second view: the answers to each prompt are then shown side by side, matched by
prompt id. Every text from the records is set as text (``textContent``), never parsed as HTML:
model output cannot add markup or script to the page.
"""

from __future__ import annotations

import json
from typing import Any, Dict

CSS = """
#samples .controls input[type=number]{width:70px}
.sample-prompt{border:1px solid #e2e8f0;border-radius:6px;margin:10px 0;padding:8px 10px;background:#fff}
.sample-prompt summary{cursor:pointer;font-size:13px;color:#334155}
.sample-prompt pre,.answer pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font-size:12px}
.sample-prompt .prompt-text{background:#f8fafc;padding:6px;border-radius:4px;max-height:180px;overflow:auto}
.sample-cols{display:grid;gap:10px;margin-top:6px}
.sample-cols.two{grid-template-columns:1fr 1fr}
.sample-col h4{margin:4px 0;font-size:12px;color:#475569}
.answer{border-left:4px solid #cbd5e1;padding:4px 8px;margin:6px 0;background:#f8fafc}
.answer.pos{border-left-color:#16a34a}.answer.neg{border-left-color:#dc2626}
.answer .meta{font-size:11px;color:#475569}
.answer .meta b{color:#0f172a}
.answer .badge{background:#fde68a;color:#92400e;border-radius:3px;padding:0 4px;margin-left:4px}
.sample-col .none{font-size:12px;color:#94a3b8;font-style:italic}
"""

JS = """
(function () {
  var holder = document.getElementById("rlhf-samples-data");
  if (!holder) return;
  var S = JSON.parse(holder.textContent);
  var selA = document.getElementById("samples-a"), selB = document.getElementById("samples-b");
  var minI = document.getElementById("samples-min"), maxI = document.getElementById("samples-max");
  var trunc = document.getElementById("samples-truncated"), list = document.getElementById("samples-list");
  var count = document.getElementById("samples-count");
  function add(parent, tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    parent.appendChild(e);
    return e;
  }
  S.sources.forEach(function (src, si) {
    [selA, selB].forEach(function (sel) {
      var g = add(sel, "optgroup");
      g.label = src.name + (src.kind === "eval" ? " (evaluation)" : "");
      src.views.forEach(function (v, vi) {
        var o = add(g, "option", null, src.name + " \\u00b7 " + v.label);
        o.value = si + ":" + vi;
      });
    });
  });
  function view(value) {
    if (!value) return null;
    var p = value.split(":");
    return S.sources[+p[0]].views[+p[1]];
  }
  function source(value) { return value ? S.sources[+value.split(":")[0]] : null; }
  function label(value) {
    var p = value.split(":"), src = S.sources[+p[0]];
    return src.name + " \\u00b7 " + src.views[+p[1]].label;
  }
  function num(input) { return input.value === "" ? null : parseFloat(input.value); }
  function passes(a) {
    var lo = num(minI), hi = num(maxI);
    if (lo !== null && !(a.reward !== undefined && a.reward >= lo)) return false;
    if (hi !== null && !(a.reward !== undefined && a.reward <= hi)) return false;
    if (trunc.value === "only" && a.truncated !== true) return false;
    if (trunc.value === "none" && a.truncated === true) return false;
    return true;
  }
  function fmt(x) { return x === undefined || x === null ? "\\u2014" : (Math.round(x * 1000) / 1000).toString(); }
  // colour: the best reward of the answer's source green, its worst red, the rest grey
  S.sources.forEach(function (src) {
    var rs = [];
    src.views.forEach(function (v) { v.answers.forEach(function (a) { if (a.reward !== undefined) rs.push(a.reward); }); });
    src.lo = Math.min.apply(null, rs); src.hi = Math.max.apply(null, rs);
  });
  function tone(a, src) {
    if (a.reward === undefined || !(src.hi > src.lo)) return "";
    return a.reward >= src.hi ? " pos" : (a.reward <= src.lo ? " neg" : "");
  }
  function card(parent, a, src) {
    var d = add(parent, "div", "answer" + tone(a, src));
    if (a.reward !== undefined) d.dataset.reward = a.reward;
    var m = add(d, "div", "meta");
    add(m, "span", null, "reward ");
    add(m, "b", null, fmt(a.reward));
    if (a.advantage !== undefined) { add(m, "span", null, " \\u00b7 advantage "); add(m, "b", null, fmt(a.advantage)); }
    if (a.tokens !== undefined) add(m, "span", null, " \\u00b7 " + a.tokens + " tokens");
    if (a.truncated === true) add(m, "span", "badge", "truncated");
    var comps = Object.keys(a.components || {});
    if (comps.length) {
      add(d, "div", "meta components", comps.map(function (k) { return k + " " + fmt(a.components[k]); }).join(" \\u00b7 "));
    }
    if (a.extracted !== undefined || a.gold !== undefined) {
      add(d, "div", "meta", (a.extracted !== undefined ? "extracted " + a.extracted + " \\u00b7 " : "") +
          "gold " + (a.gold !== undefined ? a.gold : "\\u2014"));
    }
    add(d, "pre", "response", a.response);
    if (a.clipped) add(d, "div", "meta", "text cut: " + JSON.stringify(a.clipped) + " characters left out");
  }
  function byPrompt(v) {
    var order = [], groups = {};
    (v ? v.answers : []).forEach(function (a) {
      if (!groups[a.p]) { groups[a.p] = []; order.push(a.p); }
      groups[a.p].push(a);
    });
    return {order: order, groups: groups};
  }
  function render() {
    var A = view(selA.value), B = view(selB.value);
    var ga = byPrompt(A), gb = byPrompt(B);
    list.textContent = "";
    var shown = 0, prompts = 0;
    ga.order.forEach(function (p) {
      var a = ga.groups[p].filter(passes);
      var b = B ? (gb.groups[p] || []).filter(passes) : null;
      if (!a.length && !(b && b.length)) return;
      prompts += 1;
      shown += a.length;
      var block = add(list, "div", "sample-prompt");
      block.dataset.promptId = S.prompt_ids[p];
      var det = add(block, "details");
      var rewards = ga.groups[p].map(function (x) { return x.reward; }).filter(function (x) { return x !== undefined; });
      var mean = rewards.length ? rewards.reduce(function (s, x) { return s + x; }, 0) / rewards.length : null;
      add(det, "summary", null, "prompt " + S.prompt_ids[p] + " \\u00b7 " + ga.groups[p].length +
          " answer(s), mean reward " + fmt(mean) + (B ? " \\u00b7 " + (gb.groups[p] || []).length + " in the second view" : ""));
      add(det, "pre", "prompt-text", S.prompts[p]);
      var cols = add(block, "div", "sample-cols" + (B ? " two" : ""));
      var ca = add(cols, "div", "sample-col col-a");
      add(ca, "h4", null, label(selA.value));
      if (!a.length) add(ca, "div", "none", "no answer passes the filter");
      a.forEach(function (x) { card(ca, x, source(selA.value)); });
      if (B) {
        var cb = add(cols, "div", "sample-col col-b");
        add(cb, "h4", null, label(selB.value));
        if (!gb.groups[p]) add(cb, "div", "none", "this prompt is not in the sample of this view");
        else if (!b.length) add(cb, "div", "none", "no answer passes the filter");
        b.forEach(function (x) { card(cb, x, source(selB.value)); });
      }
    });
    var total = A ? A.answers.length : 0;
    count.textContent = shown + " of " + total + " answers shown, to " + prompts + " prompt(s)" +
      (B ? "; second view: answers to the same prompts" : "");
  }
  [selA, selB, trunc].forEach(function (e) { e.addEventListener("change", render); });
  [minI, maxI].forEach(function (e) { e.addEventListener("input", render); });
  selA.value = "0:0";
  render();
  window.rlhfSamples = {render: render, select: function (a, b) { selA.value = a; selB.value = b || ""; render(); }};
})();
"""


def section(payload: Dict[str, Any]) -> str:
    """The viewer's controls and data (the list is filled by :data:`JS`), or a note when there is nothing."""
    if not payload["sources"]:
        return ('<p class="note" id=samples-none>No answers recorded: runs keep a sample of their rollouts in '
                "<code>rollout_samples.jsonl</code> (<code>--rlhf_ext.rollout_samples</code>), evalkit directories in "
                "<code>samples.jsonl</code>.</p>")
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return ('<div class="controls"><label>view <select id="samples-a"></select></label>'
            '<label>beside it <select id="samples-b"><option value="">(nothing)</option></select></label>'
            '<label>reward from <input type=number step=any id="samples-min"></label>'
            '<label>to <input type=number step=any id="samples-max"></label>'
            '<label>truncated <select id="samples-truncated"><option value="all">all</option>'
            '<option value="only">only truncated</option><option value="none">not truncated</option></select></label>'
            '<span class="small" id="samples-count"></span></div>'
            '<p class="small">Runs: a sample of each step\'s training rollouts (whole prompt groups, the same prompts '
            "whenever they come back); evaluations: evalkit's answers, reward = correct. A second view shows the "
            "answers to the same prompts beside the first.</p>"
            '<div id="samples-list"></div>'
            f'<script type="application/json" id="rlhf-samples-data">{data}</script>')

"""rlhf-ext report in a real browser: Debian's Chromium, headless, driven by Playwright, with the
network switched off.

The reports are built by the real command from one shared session fixture, ``report_inputs``:

* ``short``: two short runs with different estimators (GRPO, Dr.GRPO; 24 steps of 8 prompts x 4
  samples, 16-token limit, no entropy or mismatch metrics, as OpenRLHF logs them for the tiny
  task's smoke run) and evalkit evaluations of the shared starting model and of each final model.
  Real runs of the tiny task are used when ``tests/data/report_tiny/runs`` exists (made by
  ``tests/data/report_tiny/make_fixture.py`` from two real smoke runs once they write run
  records, issue #11); until then the runs are synthetic run records and the evaluations are
  written by evalkit's own storage and summary code (``rlhf_ext.report.synthetic``);
* ``long``: synthetic long runs (3,000 and 2,000 steps, a resumed run, one still running without
  entropy or mismatch metrics, one stopped by the guard with a non-finite loss and a torn last
  line) with evaluated checkpoints, plus the short runs.

Checked: no JavaScript error in the console, no request leaves the file, every expected panel is
there with the right number of traces (computed here from the records, not from the report's
code), a missing metric gives a note instead of a chart, and the x-axis and smoothing controls
work. Screenshots are kept in ``test-artifacts/`` (``RLHF_EXT_TEST_ARTIFACTS`` to move it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlhf_ext.report.synthetic import write_synthetic_eval, write_synthetic_run

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "data" / "report_tiny"
ARTIFACTS = Path(os.environ.get("RLHF_EXT_TEST_ARTIFACTS", REPO / "test-artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# panel id -> candidate keys per line style (the panels the issue asks for; docs/report.md)
PANEL_KEYS = {
    "pass_rate": [("train/score", "train/reward/accuracy")],
    "reward": [("train/reward", "rollout/reward_mean")],
    "response_length": [("train/response_length", "rollout/response_length_mean")],
    "truncation": [("rollout/truncated_rate", "train/truncated")],
    "entropy": [("train/entropy", "train/entropy_loss")],
    "grad_norm": [("train/actor_grad_norm", "train/grad_norm")],
    "policy_loss": [("train/policy_loss",)],
    "clip": [("train/clip_frac_low",), ("train/clip_frac_high",)],
    "kl": [("train/kl",)],
    "mismatch": [("rollout_mismatch/probs_diff_mean",)],
    "step_time": [("timing/step_total",)],
    "zero_variance": [("rlhf_ext/zero_variance_group_frac_before_filter", "train/zero_variance_group_frac")],
    "advantage_std": [("train/advantage_std",)],
    "ppo_kl": [("train/ppo_kl",)],
    "rollout_corr": [("rollout_mismatch/probs_corr_loss_1e4",)],
}


def read_metrics(run_dir: Path):
    """``{key: has a finite value}``, ``{key: had a non-finite value}`` straight from metrics.jsonl."""
    finite, nonfinite = set(), set()
    for line in (run_dir / "metrics.jsonl").read_text().split("\n"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # torn last line / blank
        for key, value in rec.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                finite.add(key)
        nonfinite.update(rec.get("nonfinite") or [])
    return finite, nonfinite


def expected_traces(run_dirs):
    """Panel id -> expected trace count (2 per run and line style, +1 per run with non-finite
    values of the key), or 0 when no run has the panel (a note instead of a chart)."""
    out = {}
    metrics = [read_metrics(d) for d in run_dirs]
    for panel, lines in PANEL_KEYS.items():
        count = 0
        for finite, nonfinite in metrics:
            for candidates in lines:
                key = next((k for k in candidates if k in finite), None)
                if key:
                    count += 2 + (key in nonfinite)
        out[panel] = count
    if not out["clip"]:
        out["clip_ratio"] = sum(2 for finite, _ in metrics if "train/ppo_clip_ratio" in finite)
    return out


def short_runs(root: Path):
    """The ``short`` scenario: two real 24-step tiny-task runs (GRPO and Dr.GRPO, made by the main job,
    ``python -m rlhf_ext.tours.smoke``) and their evaluations, copied by ``tests/data/report_tiny/make_fixture.py``."""
    runs = sorted((TINY / "runs").iterdir())
    assert [r.name for r in runs] == ["dr_grpo", "grpo"], runs
    return runs, [TINY / "evals"]


@pytest.fixture(scope="session")
def report_inputs(tmp_path_factory):
    """Run directories and evalkit directories of the two scenarios: ``short`` and ``long``."""
    root = tmp_path_factory.mktemp("report_inputs")
    tiny_runs, tiny_evals = short_runs(root / "short")
    syn = root / "synthetic"
    long_runs = [
        write_synthetic_run(syn / "grpo_3k", steps=3000, seed=0, checkpoint_every=1000),
        write_synthetic_run(syn / "dapo_resumed", steps=2000, seed=1, estimator="dr_grpo", resume=(1200, 1001),
                            speed=1.3, checkpoint_every=1000),
        write_synthetic_run(syn / "rloo_running", steps=800, seed=2, estimator="rloo", status="running",
                            mismatch=False, omit=["train/entropy_loss"]),
        write_synthetic_run(syn / "gspo_guard", steps=300, seed=3, estimator="gspo", status="stopped_by_guard",
                            nonfinite_at=250, torn_tail=True),
    ]
    evals = syn / "evals"
    write_synthetic_eval(evals / "base", model="/models/base", accuracy=0.25, seed=0)
    for r, (run, accs) in enumerate((("grpo_3k", (0.35, 0.45, 0.55)), ("dapo_resumed", (0.4, 0.5)))):
        for k, acc in enumerate(accs, 1):
            write_synthetic_eval(evals / f"{run}_{k * 1000}", model=syn / run / "ckpt" / f"global_step{k * 1000}_hf",
                                 accuracy=acc, seed=10 * r + k)
    return {"short": (tiny_runs, tiny_evals), "long": (long_runs + tiny_runs, [evals, *tiny_evals])}


def build(run_dirs, eval_dirs, out: Path, names=None):
    cmd = [sys.executable, "-m", "rlhf_ext.cli", "report", *map(str, run_dirs), "--evals", *map(str, eval_dirs),
           "-o", str(out)]
    if names:
        cmd += ["--names", names]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out)
    return out


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Chromium is missing: scripts/setup_env.sh installs Debian's chromium package"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


def open_offline(browser, path: Path):
    """Open ``path`` with the network off; returns (page, context, console errors, outside requests)."""
    context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
    errors, outside = [], []

    def route(r):
        outside.append(r.request.url)
        r.abort()

    context.route("http*://**/*", route)
    page = context.new_page()
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("requestfailed", lambda r: outside.append(f"failed: {r.url}"))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("() => window.Plotly && Array.from(document.querySelectorAll('.plotly-graph-div'))"
                           ".every(d => d._fullLayout && d.querySelector('svg.main-svg'))", timeout=60_000)
    return page, context, errors, outside


def trace_counts(page):
    return page.evaluate("() => Object.fromEntries(Array.from(document.querySelectorAll('.plotly-graph-div'))"
                         ".map(d => [d.id, d.data.length]))")


def check_panels(page, run_dirs):
    counts = trace_counts(page)
    expected = expected_traces(run_dirs)
    for panel, n in expected.items():
        if n:
            assert counts.get(f"fig-dyn-{panel}") == n, (panel, counts)
        elif panel == "clip" and expected.get("clip_ratio"):
            continue  # drawn as the fallback panel (OpenRLHF's two-sided clip ratio), with a note
        else:
            assert f"fig-dyn-{panel}" not in counts
            note = page.inner_text(f"#missing-{panel}")
            assert "No run logged" in note, note
    return counts


def test_short_runs_report_in_chromium_offline(report_inputs, browser, tmp_path):
    run_dirs, eval_dirs = report_inputs["short"]
    out = build(run_dirs, eval_dirs, tmp_path / "tiny.html", names="GRPO,Dr.GRPO")
    head = out.read_text()[:20_000]
    assert "plotly.js v" in head  # the library is inlined in the page's head, not linked
    page, context, errors, outside = open_offline(browser, out)
    try:
        assert page.evaluate("() => document.querySelectorAll('script[src], link[href], img[src]').length") == 0
        counts = check_panels(page, run_dirs)
        # evaluation: avg@n, pass@k and maj@n, each with a band and a line per run
        for metric in ("avgn", "passk", "majn"):
            assert counts.get(f"fig-eval-0-{metric}") == 4, counts
        assert page.locator("#run-table tr").count() == 3
        assert "GRPO" in page.inner_text("#run-table") and "Dr.GRPO" in page.inner_text("#run-table")
        assert page.locator("#config-diff tr").count() >= 2
        assert page.locator("#throughput-table tr").count() == 3  # header + one row per run
        pairs = page.inner_text("#pair-table")
        assert "between runs" in pairs and "over training" in pairs
        assert ("within noise" in pairs) or ("distinguishable" in pairs)
        assert page.locator("#headline li").count() >= 3

        # window "off" shows the recorded values themselves: compare with metrics.jsonl
        page.select_option("#window", "1")
        page.wait_for_function("() => document.body.dataset.window === '1'")
        trace = page.evaluate("() => { const t = document.getElementById('fig-dyn-pass_rate')._fullData[1];"
                              " return [Array.from(t.x), Array.from(t.y)]; }")
        recorded = {}
        for line in (run_dirs[0] / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if "train/score" in rec:
                recorded[rec["step"]] = rec["train/score"]
        assert [int(s) for s in trace[0]] == sorted(recorded)
        assert trace[1] == pytest.approx([recorded[s] for s in sorted(recorded)], abs=1e-6)

        # wall-clock x axis: x becomes the elapsed time, increasing, and the axis title says so
        page.select_option("#xaxis", "wall")
        page.wait_for_function("() => document.body.dataset.xaxis === 'wall'")
        wall = page.evaluate("() => { const gd = document.getElementById('fig-dyn-reward');"
                             " return [Array.from(gd._fullData[1].x), gd.layout.xaxis.title.text]; }")
        assert "wall-clock" in wall[1] and len(wall[0]) == len(recorded)
        assert all(b > a for a, b in zip(wall[0], wall[0][1:])) and wall[0][0] > 0
        elapsed = [json.loads(x)["elapsed_s"] / 60 for x in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
        assert wall[0] == pytest.approx(elapsed, rel=1e-6)  # minutes, from the run's own elapsed_s
        # equal budgets: samples generated on the x axis, from each step's rollout/num_samples, cumulated
        page.select_option("#xaxis", "samples")
        page.wait_for_function("() => document.body.dataset.xaxis === 'samples'")
        budget = page.evaluate("() => { const gd = document.getElementById('fig-dyn-pass_rate');"
                               " return [Array.from(gd._fullData[1].x), gd.layout.xaxis.title.text]; }")
        samples = [json.loads(x)["rollout/num_samples"] for x in (run_dirs[0] / "metrics.jsonl").read_text().splitlines()]
        assert budget[1] == "samples generated"
        assert budget[0] == pytest.approx([sum(samples[:i + 1]) for i in range(len(samples))])
        table = page.inner_text("#run-table")
        assert "budget: samples generated" in table and f"{sum(samples):.0f}" in table
        page.select_option("#xaxis", "tokens")
        page.wait_for_function("() => document.body.dataset.xaxis === 'tokens'")
        assert page.evaluate("() => document.getElementById('fig-dyn-reward').layout.xaxis.title.text") == \
            "tokens generated"
        page.select_option("#xaxis", "step")
        page.wait_for_function("() => document.body.dataset.xaxis === 'step'")
        # the ticks plotly drew on the step axis are integers, after the switches and after a zoom to 1.5 steps
        ticks = "() => document.getElementById('fig-dyn-reward')._fullLayout.xaxis._vals.map(v => v.x)"
        drawn = page.evaluate(ticks)
        assert drawn and all(float(x).is_integer() for x in drawn), drawn
        page.evaluate("() => Plotly.relayout('fig-dyn-reward', {'xaxis.range': [1, 2.5]})")
        page.wait_for_function("() => document.getElementById('fig-dyn-reward').layout.xaxis.dtick === 1")
        drawn = page.evaluate(ticks)
        assert drawn and all(float(x).is_integer() for x in drawn), drawn

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "report_short.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
        assert errors == [], errors
        assert outside == [], outside
    finally:
        context.close()


def test_long_resumed_running_and_stopped_runs_in_chromium_offline(report_inputs, browser, tmp_path):
    run_dirs, eval_dirs = report_inputs["long"]
    out = build(run_dirs, eval_dirs, tmp_path / "long.html")
    page, context, errors, outside = open_offline(browser, out)
    try:
        counts = check_panels(page, run_dirs)
        assert counts["fig-timing"] >= 3  # one bar trace per timing phase
        # every raw curve thinned to the display budget
        longest = page.evaluate("() => Math.max(...Array.from(document.querySelectorAll('.plotly-graph-div'))"
                                ".flatMap(d => d._fullData.map(t => t.x ? t.x.length : 0)))")
        assert 0 < longest <= 800
        status = page.inner_text("#run-table")
        for word in ("finished", "running", "stopped by guard", "resumed at 1001"):
            assert word in status, status
        # OpenRLHF's eval/* values, on the step axis beside evalkit's: one line per run that logged them,
        # through the recorded steps (checkpoints every 1000 steps: grpo_3k and dapo_resumed)
        evals = page.evaluate("() => { const gd = document.getElementById('fig-traineval-0');"
                              " return gd.data.map(t => [t.name, Array.from(gd._fullData[gd.data.indexOf(t)].x)]); }")
        assert evals == [["grpo_3k", [1000, 2000, 3000]], ["dapo_resumed", [1000, 2000]]]
        incidents = page.inner_text("#incidents-table")
        for word in ("guard incident", "restart", "no end record", "non-finite metric", "mismatch warning"):
            assert word in incidents, incidents
        # all smoothing windows can be applied without a JavaScript error
        for option in page.eval_on_selector_all("#window option", "os => os.map(o => o.value)"):
            page.select_option("#window", option)
            page.wait_for_function(f"() => document.body.dataset.window === '{option}'")
        page.select_option("#xaxis", "wall")
        page.wait_for_function("() => document.body.dataset.xaxis === 'wall'")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report_long.png"), full_page=True)
        assert errors == [], errors
        assert outside == [], outside
    finally:
        context.close()


def final_window_mean(run_dir: Path, key: str, k: int) -> float:
    values = [rec[key] for rec in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if key in rec]
    return sum(values[-k:]) / k


def test_seed_groups_in_chromium_offline(browser, tmp_path):
    """Two recipes x three seeds (synthetic run records that differ only in train.seed within a recipe) with
    an evaluation of every seed's final model: the group table, the group comparison and the two figures,
    their values recomputed here from metrics.jsonl."""
    root = tmp_path / "seeds"
    groups = {"grpo": (0.55, 0), "dr_grpo": (0.7, 10)}
    run_dirs = []
    for estimator, (rate, base_seed) in groups.items():
        for s in range(3):
            run = write_synthetic_run(root / f"{estimator}_seed{s}", steps=120, seed=base_seed + s,
                                      estimator=estimator, final_rate=rate, mismatch=False)
            write_synthetic_eval(root / "evals" / run.name, model=run / "final", accuracy=rate - 0.1 + 0.03 * s,
                                 seed=base_seed + s)
            run_dirs.append(run)
    out = build(run_dirs, [root / "evals"], tmp_path / "seeds.html")
    page, context, errors, outside = open_offline(browser, out)
    try:
        table = page.inner_text("#group-table")
        assert page.locator("#group-table tr").count() == 3 and "grpo_seed1 (seed 1)" in table
        comparison = page.inner_text("#group-comparisons")
        assert "dr_grpo \u2212 grpo" in comparison and "final-window batch pass rate" in comparison
        assert "avg@n" in comparison  # the final evaluations are compared by group too
        counts = trace_counts(page)
        assert counts["fig-groups-curve"] == 4 and counts["fig-groups-final"] == 4  # band + line / seeds + mean
        # the per-seed points are each run's final-window mean of train/score (window: 10 steps)
        seeds = page.evaluate("() => document.getElementById('fig-groups-final')._fullData"
                              ".filter((t, i) => i % 2 === 0).map(t => Array.from(t.y))")
        expected = [[final_window_mean(d, "train/score", 10) for d in run_dirs[g * 3:(g + 1) * 3]] for g in range(2)]
        assert seeds[0] == pytest.approx(expected[0], abs=1e-6) and seeds[1] == pytest.approx(expected[1], abs=1e-6)
        mean = page.evaluate("() => document.getElementById('fig-groups-final')._fullData[1].y[0]")
        assert mean == pytest.approx(sum(expected[0]) / 3, abs=1e-6)
        # the curve is the mean over seeds of each seed's moving average (trailing, page default window)
        window = int(page.evaluate("() => document.body.dataset.window"))
        curve = page.evaluate("() => { const t = document.getElementById('fig-groups-curve')._fullData[1];"
                              " return [Array.from(t.x), Array.from(t.y)]; }")
        scores = [[rec["train/score"] for rec in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]
                  for d in run_dirs[:3]]
        smoothed = [[sum(s[max(0, i - window + 1):i + 1]) / len(s[max(0, i - window + 1):i + 1]) for i in range(120)]
                    for s in scores]
        assert [int(x) for x in curve[0]] == list(range(1, 121))
        assert curve[1] == pytest.approx([sum(col) / 3 for col in zip(*smoothed)], abs=1e-5)
        assert "Seed groups (runs that differ only in their seed)" in page.inner_text("#headline")
        # evaluation verdicts at the resolution the seeds measured (no --min-effect given)
        verdicts = page.eval_on_selector_all("#pair-table [data-verdict]", "es => es.map(e => e.dataset.verdict)")
        assert verdicts and set(verdicts) <= {"better", "worse", "no difference"}
        assert "= seed spread" in page.inner_text("#pair-table + p")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "report_seed_groups.png"
        page.locator("#groups").screenshot(path=str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert errors == [], errors
        assert outside == [], outside
    finally:
        context.close()


SAMPLE_PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he write a year?",
]
SAMPLE_GOLD = ["72", "10", "624"]


def write_rollout_samples(run_dir: Path):
    """Hand-made ``rollout_samples.jsonl`` (the format's own record builder, appended as the writer does):
    the same three prompts at steps 1, 15 and 30, four answers each, right more often later; one
    truncated answer; one answer that tries to inject markup. Returns the records."""
    from rlhf_ext import runs

    records = []
    for step, right in ((1, 1), (15, 2), (30, 4)):
        for p, (prompt, gold) in enumerate(zip(SAMPLE_PROMPTS, SAMPLE_GOLD)):
            for k in range(4):
                ok = k < right - (p == 2)
                cut = step == 1 and p == 1 and k == 3
                response = (f"<think>Step by step: ... so the total is {gold}.</think> The answer is \\boxed{{{gold}}}."
                            if ok else ("Let me think. First, 48 / 2 = 24, then 48 + 24 = " if cut else
                                        f"The answer is \\boxed{{{int(gold) + k + 1}}}."))
                if step == 15 and p == 0 and k == 3:
                    response = "<script>window.__pwned = 1</script><b>bold?</b>"
                reward = (1.0 if ok else 0.0) + 0.2 * (not cut) - 0.5 * cut
                records.append(runs.rollout_sample_record(
                    step, prompt=prompt, response=response, reward=reward,
                    components={"reward/accuracy": float(ok), "reward/answer_format": 0.2 * (not cut),
                                "reward/truncation": -0.5 * cut},
                    advantage=None, truncated=cut, response_tokens=16 if cut else 9 + k, label=gold))
        group = records[-12:]
        for p in range(3):  # GRPO-style advantages within each prompt group
            rs = [r["reward"] for r in group[4 * p:4 * p + 4]]
            mean = sum(rs) / 4
            std = (sum((x - mean) ** 2 for x in rs) / 3) ** 0.5
            for r in group[4 * p:4 * p + 4]:
                r["advantage"] = (r["reward"] - mean) / (std + 1e-6)
    for rec in records:
        runs.append_jsonl(run_dir / runs.ROLLOUT_SAMPLES, rec)
    return records


def test_sample_viewer_in_chromium_offline(browser, tmp_path):
    """Pick a step, read the answers, filter by reward and truncation, see the same prompt at two steps,
    and an evalkit evaluation's answers in the same viewer; counts recomputed here from the files."""
    from rlhf_ext.evalkit.records import SampleLog

    root = tmp_path / "samples"
    run = write_synthetic_run(root / "grpo", steps=30, seed=0, mismatch=False)
    records = write_rollout_samples(run)
    ev = write_synthetic_eval(root / "evals" / "grpo_final", model=run / "final", accuracy=0.6, problems=3,
                              n_samples=4)
    evrecs = SampleLog(ev / "samples.jsonl").read()
    for rec in evrecs:
        i = int(rec["problem_id"][1:])
        rec.update(prompt=SAMPLE_PROMPTS[i], gold=SAMPLE_GOLD[i],
                   response=f"... so the answer is \\boxed{{{SAMPLE_GOLD[i] if rec['correct'] else rec['extracted']}}}.")
    (ev / "samples.jsonl").unlink()
    with SampleLog(ev / "samples.jsonl") as log:
        log.append(evrecs)
    out = build([run], [root / "evals"], tmp_path / "samples.html")
    page, context, errors, outside = open_offline(browser, out)
    try:
        options = page.eval_on_selector_all("#samples-a option", "os => os.map(o => o.textContent)")
        assert options == ["grpo \u00b7 step 1", "grpo \u00b7 step 15", "grpo \u00b7 step 30",
                           "evaluation of grpo step 30 \u00b7 task gsm8k"]

        def shown():
            return page.eval_on_selector_all("#samples-list .col-a .answer", "es => es.map(e => "
                                             "[e.querySelector('pre').textContent, parseFloat(e.dataset.reward)])")

        step1 = [r for r in records if r["step"] == 1]
        assert shown() == [[r["response"], pytest.approx(r["reward"])] for r in step1]
        assert page.locator("#samples-list .sample-prompt").count() == 3
        # filter by reward: only the answers with reward >= 1
        page.fill("#samples-min", "1")
        assert shown() == [[r["response"], pytest.approx(r["reward"])] for r in step1 if r["reward"] >= 1]
        page.fill("#samples-min", "")
        page.select_option("#samples-truncated", "only")
        assert [s[0] for s in shown()] == [r["response"] for r in step1 if r["truncated"]]
        assert page.locator("#samples-list .answer .badge").count() == 1
        page.select_option("#samples-truncated", "all")
        # the same prompt at two steps: step 1 beside step 30, matched by prompt
        page.evaluate("() => window.rlhfSamples.select('0:0', '0:2')")
        blocks = page.locator("#samples-list .sample-prompt")
        assert blocks.count() == 3
        for b in range(3):
            block = blocks.nth(b)
            pid = block.get_attribute("data-prompt-id")
            right = block.locator(".col-b pre.response").all_text_contents()
            assert right == [r["response"] for r in records if r["step"] == 30 and r["prompt_id"] == pid]
            left = block.locator(".col-a pre.response").all_text_contents()
            assert left == [r["response"] for r in step1 if r["prompt_id"] == pid]
        # model text is text: the injected markup shows as characters and runs nothing
        page.evaluate("() => window.rlhfSamples.select('0:1', '')")
        assert "<script>window.__pwned = 1</script><b>bold?</b>" in page.inner_text("#samples-list")
        assert page.evaluate("() => window.__pwned") is None
        # evalkit's answers in the same viewer: reward = correct
        page.evaluate("() => window.rlhfSamples.select('1:0', '')")
        assert sorted(shown()) == sorted([r["response"], float(r["correct"])] for r in evrecs)
        # a training step beside the evaluation, matched by prompt text
        page.evaluate("() => window.rlhfSamples.select('0:2', '1:0')")
        for b in range(3):
            block = blocks.nth(b)
            pid = block.get_attribute("data-prompt-id")
            i = [runs_prompt_id(p) for p in SAMPLE_PROMPTS].index(pid)
            assert block.locator(".col-b .answer").count() == sum(1 for r in evrecs if r["problem_id"] == f"p{i}")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.evaluate("() => { window.rlhfSamples.select('0:0', '0:2');"
                      " document.querySelector('#samples-list details').open = true;"
                      " document.querySelector('nav').style.display = 'none'; }")  # the sticky bar off the shot
        # the source's best reward green, its worst red
        tones = page.eval_on_selector_all("#samples-list .col-a .answer", "es => es.map(e => e.className)")
        best, worst = max(r["reward"] for r in records), min(r["reward"] for r in records)
        assert tones == ["answer" + (" pos" if r["reward"] == best else " neg" if r["reward"] == worst else "")
                         for r in step1]
        shot = ARTIFACTS / "report_samples.png"
        page.locator("#samples").screenshot(path=str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert errors == [], errors
        assert outside == [], outside
    finally:
        context.close()


def runs_prompt_id(prompt: str) -> str:
    from rlhf_ext.runs import prompt_id

    return prompt_id(prompt)

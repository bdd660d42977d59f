"""rlhf-ext report: the command, its errors, the file-size bound at 10 runs x 10,000 steps, and the
smoke run's report hook."""

import base64
import json
import re
import subprocess
import sys

from rlhf_ext.cli import main
from rlhf_ext.evalkit.records import write_json_atomic
from rlhf_ext.report import SIZE_BOUND_BYTES, find_records, report_workdir, write_report
from rlhf_ext.report.figures import MAX_RAW_POINTS, MAX_SMOOTH_POINTS
from rlhf_ext.report.synthetic import write_synthetic_eval, write_synthetic_run, write_synthetic_runs


def figures_in(html: str) -> dict:
    """div id -> number of traces, read from the Plotly.newPlot calls of the page."""
    out = {}
    for match in re.finditer(r'Plotly\.newPlot\(\s*"([^"]+)",\s*(\[.*?\]),\s*\{', html, re.S):
        out[match.group(1)] = len(json.loads(match.group(2)))
    return out


def test_help_explains_with_an_example():
    out = subprocess.run([sys.executable, "-m", "rlhf_ext.cli", "report", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0
    assert "example:" in out.stdout and "--evals" in out.stdout and "--names" in out.stdout


def test_report_command_writes_one_page(tmp_path, capsys):
    a = write_synthetic_run(tmp_path / "a", steps=50, checkpoint_every=25)
    b = write_synthetic_run(tmp_path / "b", steps=40, seed=1, estimator="dr_grpo", mismatch=False)
    write_synthetic_eval(tmp_path / "evals" / "a25", model=a / "ckpt" / "global_step25_hf", accuracy=0.4)
    out = tmp_path / "sub" / "r.html"
    assert main(["report", str(a), str(b), "--evals", str(tmp_path / "evals"), "--names", "GRPO,Dr.GRPO",
                 "-o", str(out), "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    html = out.read_text()
    assert html.count("plotly.js v") == 1  # the library once
    figs = figures_in(html)
    assert figs["fig-dyn-pass_rate"] == 4 and figs["fig-dyn-clip"] == 8
    assert figs["fig-dyn-mismatch"] == 2  # b has no mismatch metrics ...
    assert "Not logged by Dr.GRPO." in html  # ... and the panel says so
    assert figs["fig-eval-0-avgn"] == 2
    assert "<td><code>algo.advantage.estimator</code></td><td>grpo</td><td>dr_grpo</td>" in html


def test_report_command_errors_name_the_problem(tmp_path, capsys):
    ev = write_synthetic_eval(tmp_path / "ev", model="/m", accuracy=0.5)
    run = write_synthetic_run(tmp_path / "run", steps=5)
    assert main(["report", str(ev), "-o", str(tmp_path / "x.html")]) == 2
    assert "evalkit output directory, not a training run; pass it with --evals" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "x.html")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["report", str(run), "--names", "a,b", "-o", str(tmp_path / "x.html")]) == 2
    assert "2 names for 1 run" in capsys.readouterr().err
    assert main(["report", str(run), "--evals", str(run), "-o", str(tmp_path / "x.html")]) == 2
    assert "no evalkit output directory" in capsys.readouterr().err
    assert main(["report", str(run), "--names", " ", "-o", str(tmp_path / "x.html")]) == 2
    assert "empty name" in capsys.readouterr().err
    assert not (tmp_path / "x.html").exists()


def test_ten_runs_of_ten_thousand_steps_stay_under_the_size_bound(tmp_path):
    from rlhf_ext import runs as record

    runs = write_synthetic_runs(tmp_path / "runs", runs=10, steps=10_000)
    for r, run in enumerate(runs):  # rollout samples with long texts: more than the page keeps
        for step in range(1, 10_001, 100):
            for k in range(2):
                record.append_jsonl(run / record.ROLLOUT_SAMPLES, record.rollout_sample_record(
                    step, prompt=f"prompt {step % 700} " + "p" * 1500, response=f"run {r} answer {k} " + "r" * 5000,
                    reward=float(k), components={"reward/accuracy": float(k)}, advantage=k - 0.5, truncated=False,
                    response_tokens=900))
    out = write_report(runs, tmp_path / "big.html")
    size = out.stat().st_size
    assert size < SIZE_BOUND_BYTES, size
    html = out.read_text()
    assert html.count("shows ") >= 10 and "of its 200 recorded answers" in html  # each run's sample was cut, and says so
    figs = figures_in(html)
    assert figs["fig-dyn-pass_rate"] == 20 and figs["fig-dyn-clip"] == 40
    # every trace is thinned to the display budget: count the points of each base64 float32 array
    for match in re.finditer(r'"x":\{"dtype":"i4","bdata":"([^"]*)"', html):
        points = len(base64.b64decode(match.group(1).replace("\\u002f", "/"))) // 4
        assert 0 < points <= max(MAX_RAW_POINTS, MAX_SMOOTH_POINTS)


def test_smoke_workdir_report(tmp_path):
    work = tmp_path / "smoke"
    (work / "task" / "model").mkdir(parents=True)
    (work / "task" / "model" / "config.json").write_text('{"model_type": "qwen2"}')  # a model, not a record
    assert report_workdir(work)[0] is None
    assert "no run record" in report_workdir(work)[1]
    run = write_synthetic_run(work / "trained_ds" / "run", steps=12,
                              extra_args={"actor.model_name_or_path": str(work / "task" / "model")})
    write_synthetic_eval(work / "eval_before", model=work / "task" / "model", accuracy=0.25)
    assert find_records(work) == ([run], [work / "eval_before"])
    path, message = report_workdir(work)
    assert path == work / "report.html" and message == "1 run(s), 1 evaluation(s)"
    assert figures_in(path.read_text())["fig-eval-0-avgn"] == 2


def test_evalkit_directory_without_samples_is_not_a_record(tmp_path):
    write_json_atomic(tmp_path / "half" / "config.json", {"suite": "gsm8k", "generation": {}})
    assert find_records(tmp_path) == ([], [])


def test_a_run_that_just_started_renders(tmp_path):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "config.json").write_text(json.dumps({"schema": "rlhf_ext.run/1", "name": "fresh", "args": {}}))
    (fresh / "events.jsonl").write_text(json.dumps({"event": "start", "time": 1.0, "step": 0}) + "\n")
    other = write_synthetic_run(tmp_path / "other", steps=20)
    html = write_report([other, fresh], tmp_path / "r.html").read_text()
    assert "No step recorded yet by fresh." in html
    assert "fresh is still running (or was killed without an end record); no step recorded yet." in html
    assert figures_in(html)["fig-dyn-pass_rate"] == 2
    alone = write_report([fresh], tmp_path / "alone.html").read_text()
    assert 'id="missing-pass_rate"' in alone and "fig-dyn-" not in alone

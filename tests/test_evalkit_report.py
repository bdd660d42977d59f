"""evalkit summaries and comparisons on hand-made run directories (hand-computed expectations)."""

import json
import random
from pathlib import Path

import pytest

from rlhf_ext.evalkit.cli import main as evalkit_main
from rlhf_ext.evalkit.records import RunDirError, SampleLog, write_json_atomic
from rlhf_ext.evalkit.summary import compare_runs, render_compare_markdown, render_markdown, report, summarize


def make_config(tasks, n, ids, suite=None, sha="s" * 64):
    return {
        "suite": suite or tasks[0], "tasks": list(tasks), "n_samples": n,
        "datasets": {t: {"source": "x", "sha256": sha, "problems": len(ids[t]), "problem_ids": list(ids[t])}
                     for t in tasks},
        "generation": {"model": "m", "template": "r1", "temperature": 0.6, "top_p": 0.95, "max_tokens": 64,
                       "seed": 0},
        "statistics": {"bootstrap_resamples": 1000, "bootstrap_seed": 0},
    }


def make_rec(task, pid, idx, correct, extracted, tokens=10, truncated=False):
    return {"task": task, "problem_id": pid, "sample_index": idx, "correct": correct, "extracted": extracted,
            "response_tokens": tokens, "truncated": truncated, "gold_parsed": True, "grade_timeout": False,
            "grade_error": None}


def three_problem_records(task="math500"):
    recs = []
    # p1: 4/4 correct, all answer "5"
    recs += [make_rec(task, "p1", i, True, "5", tokens=10) for i in range(4)]
    # p2: 2/4 correct, answers tie 2-2 between "3" (right) and "4" (wrong)
    recs += [make_rec(task, "p2", i, i < 2, "3" if i < 2 else "4", tokens=20) for i in range(4)]
    # p3: 0/4, no extracted answers, all truncated
    recs += [make_rec(task, "p3", i, False, None, tokens=64, truncated=True) for i in range(4)]
    return recs


def test_summary_hand_computed():
    cfg = make_config(["math500"], 4, {"math500": ["p1", "p2", "p3"]})
    s = summarize(three_problem_records(), cfg)
    t = s["tasks"]["math500"]
    assert s["complete"] and t["missing_samples"] == 0 and t["samples"] == 12
    assert t["avg@n"]["value"] == pytest.approx((1 + 0.5 + 0) / 3)
    # pass@2 per problem: 1, 1 - C(2,2)/C(4,2) = 5/6, 0
    assert t["pass@k"]["2"]["value"] == pytest.approx((1 + 5 / 6 + 0) / 3)
    assert t["pass@k"]["4"]["value"] == pytest.approx(2 / 3)
    assert t["pass@k"]["1"]["value"] == pytest.approx(t["avg@n"]["value"])
    # maj@4: p1 right, p2 tie between a right and a wrong answer (0.5), p3 nobody voted (0)
    assert t["maj@n"]["value"] == pytest.approx(0.5)
    assert t["truncation_rate"] == pytest.approx(4 / 12)
    assert t["no_answer_rate"] == pytest.approx(4 / 12)
    assert t["response_tokens"] == {"mean": pytest.approx((40 + 80 + 256) / 12), "p50": 20.0, "p90": 64.0}
    lo, hi = t["avg@n"]["ci95"]
    assert 0.0 <= lo <= t["avg@n"]["value"] <= hi <= 1.0
    md = render_markdown(s)
    assert "| math500 | 3 | 50.0 [" in md and "avg@4" in md and "maj@4" in md and "pass@4" in md


def test_summary_is_independent_of_record_order_and_reproducible():
    cfg = make_config(["math500"], 4, {"math500": ["p1", "p2", "p3"]})
    recs = three_problem_records()
    shuffled = recs[:]
    random.Random(3).shuffle(shuffled)
    a = json.dumps(summarize(recs, cfg), sort_keys=True)
    assert a == json.dumps(summarize(shuffled, cfg), sort_keys=True)
    assert a == json.dumps(summarize(recs, cfg), sort_keys=True)


def test_incomplete_run_and_out_of_range_samples():
    cfg = make_config(["math500"], 4, {"math500": ["p1", "p2", "p3", "p4"]})
    recs = three_problem_records()
    recs = [r for r in recs if not (r["problem_id"] == "p2" and r["sample_index"] == 3)]  # p2 has 3 samples
    recs.append(make_rec("math500", "p1", 7, False, "9"))  # beyond n: ignored
    recs.append(make_rec("math500", "zz", 0, True, "1"))  # not one of the run's problems: ignored
    s = summarize(recs, cfg)
    t = s["tasks"]["math500"]
    assert not s["complete"]
    assert t["missing_samples"] == 4 * 4 - 11 and t["problems_with_samples"] == 3
    assert t["avg@n"]["value"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert set(t["pass@k"]) == {"1", "2"}  # pass@4 needs 4 samples of every problem
    assert "Incomplete run" in render_markdown(s)


def test_combined_row_pools_problems_of_both_years():
    ids = {"aime24": ["p1", "p2", "p3"], "aime25": ["q1"]}
    cfg = make_config(["aime24", "aime25"], 4, ids, suite="aime")
    recs = three_problem_records("aime24") + [make_rec("aime25", "q1", i, True, "1") for i in range(4)]
    s = summarize(recs, cfg)
    assert set(s["tasks"]) == {"aime24", "aime25", "aime"}
    assert s["tasks"]["aime25"]["avg@n"]["value"] == 1.0
    assert s["tasks"]["aime"]["avg@n"]["value"] == pytest.approx((1 + 0.5 + 0 + 1) / 4)
    assert s["tasks"]["aime"]["problems"] == 4 and s["tasks"]["aime"]["samples"] == 16


def write_run(path: Path, cfg, recs):
    path.mkdir(parents=True)
    write_json_atomic(path / "config.json", cfg)
    with SampleLog(path / "samples.jsonl") as log:
        log.append(recs)
    return path


def per_problem_run(path, scores, n=4, sha="s" * 64, task="math500"):
    """A run where problem i has round(scores[i] * n) correct samples."""
    ids = [f"p{i}" for i in range(len(scores))]
    recs = []
    for pid, sc in zip(ids, scores):
        c = round(sc * n)
        recs += [make_rec(task, pid, j, j < c, "1" if j < c else "2") for j in range(n)]
    return write_run(path, make_config([task], n, {task: ids}, sha=sha), recs)


def test_compare_detects_a_consistent_gain_and_not_noise(tmp_path):
    base = [0.0, 0.25, 0.5, 0.25, 0.0, 0.75, 0.5, 0.25, 0.0, 0.5] * 2
    a = per_problem_run(tmp_path / "a", base)
    b = per_problem_run(tmp_path / "b", [s + 0.25 for s in base])
    c = per_problem_run(tmp_path / "c", [s + (0.25 if i % 2 else -0.25) if 0.25 <= s <= 0.5 else s
                                         for i, s in enumerate(base)])
    result = compare_runs([a, b, c], resamples=1000)
    ab = result["comparisons"][0]["tasks"]["math500"]["avg@n"]
    assert ab["difference"] == pytest.approx(0.25) and ab["distinguishable"]
    assert ab["baseline"] == pytest.approx(sum(base) / len(base))
    assert ab["run_better_problems"] == 20 and ab["baseline_better_problems"] == 0
    ac = result["comparisons"][1]["tasks"]["math500"]["avg@n"]
    assert ac["ci95"][0] < 0 < ac["ci95"][1] and not ac["distinguishable"]
    md = render_compare_markdown(result)
    assert "+25.0 [+25.0, +25.0] | distinguishable" in md and "within noise" in md


def test_compare_refuses_different_datasets_and_disjoint_tasks(tmp_path):
    a = per_problem_run(tmp_path / "a", [0.5, 0.25])
    b = per_problem_run(tmp_path / "b", [0.5, 0.25], sha="t" * 64)
    with pytest.raises(RunDirError, match="different copies of the dataset"):
        compare_runs([a, b])
    g = per_problem_run(tmp_path / "g", [0.5], task="gsm8k")
    with pytest.raises(RunDirError, match="share no task"):
        compare_runs([a, g])
    with pytest.raises(ValueError, match="at least two"):
        compare_runs([a])
    with pytest.raises(RunDirError, match="not a directory"):
        compare_runs([a, tmp_path / "missing"])


def test_cli_report_and_compare_in_process(tmp_path, capsys):
    a = per_problem_run(tmp_path / "a", [0.5, 0.25, 1.0])
    b = per_problem_run(tmp_path / "b", [0.75, 0.5, 1.0])
    assert evalkit_main(["report", str(a)]) == 0
    out = capsys.readouterr().out
    assert "| math500 | 3 | 58.3 [" in out
    assert evalkit_main(["report", str(a), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == report(a)
    assert evalkit_main(["compare", str(a), str(b), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["comparisons"][0]["tasks"]["math500"]["avg@n"]["difference"] == pytest.approx(0.5 / 3)
    assert evalkit_main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_cli_usage_errors(capsys):
    assert evalkit_main(["math500"]) == 2
    assert "--model is required" in capsys.readouterr().err
    assert evalkit_main(["math500", "--model", "m", "--n-samples", "0"]) == 2
    assert "--n-samples must be >= 1" in capsys.readouterr().err
    assert evalkit_main(["math500", "--model", "m", "--top-p", "1.5"]) == 2
    assert "--top-p must be in (0, 1]" in capsys.readouterr().err
    assert evalkit_main(["mmlu"]) == 2
    assert "unknown command 'mmlu'" in capsys.readouterr().err
    assert evalkit_main(["math500", "--resume"]) == 2
    assert "--resume needs --output" in capsys.readouterr().err
    assert evalkit_main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert {t["task"] for t in listing["tasks"]} == {"aime24", "aime25", "math500", "gsm8k", "amc23"}
    assert listing["suites"]["aime"] == ["aime24", "aime25"]


def test_run_directory_checks_happen_before_any_model_is_touched(tmp_path):
    from rlhf_ext.evalkit.runner import RunOptions, default_output_dir, execute, prepare

    data = str(Path("../shared/data/amc23.jsonl"))
    base = dict(suite="amc23", model="no/such-model", data=[data], limit=2, n_samples=2)
    with pytest.raises(RunDirError, match="holds no run"):
        execute(prepare(RunOptions(output=tmp_path / "empty", resume=True, **base)))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "samples.jsonl").write_text('{"task": "amc23", "problem_id": "0", "sample_index": 0}\n')
    with pytest.raises(RunDirError, match="not an evalkit run directory"):
        execute(prepare(RunOptions(output=foreign, **base)))
    other = tmp_path / "other"
    write_run(other, make_config(["gsm8k"], 2, {"gsm8k": ["0"]}), [])
    with pytest.raises(RunDirError, match="holds a 'gsm8k' run, not 'amc23'"):
        execute(prepare(RunOptions(output=other, **base)))
    # the default directory is a function of the generation parameters
    a = prepare(RunOptions(**base))
    assert a.output == default_output_dir(a.options, a.generation) == prepare(RunOptions(**base)).output
    assert a.output.parts[:2] == ("evalkit_runs", "such-model") and a.output.name.startswith("amc23-")
    assert prepare(RunOptions(temperature=1.0, **base)).output != a.output
    assert prepare(RunOptions(**{**base, "n_samples": 8})).output == a.output  # n may grow in place

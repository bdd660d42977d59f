"""Verdicts at the experiment's resolution (evalkit compare --min-effect) and the grader audit (evalkit audit)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from rlhf_ext.evalkit.audit import allocate, draw, run_audit, wilson
from rlhf_ext.evalkit.cli import main as evalkit_main
from rlhf_ext.evalkit.records import RunDirError
from rlhf_ext.evalkit.resolution import (BETTER, NO_DIFFERENCE, WORSE, audited_error, min_effect, seed_spread,
                                         verdict)
from rlhf_ext.report.synthetic import write_synthetic_eval

TINY_EVALS = Path(__file__).resolve().parent / "data" / "report_tiny" / "evals"


def test_verdict_hand_cases():
    m3 = min_effect(3.0)
    assert verdict(5.0, [1.0, 9.0], m3)[0] == BETTER
    assert verdict(-4.0, [-7.0, -1.0], m3)[0] == WORSE
    word, reason = verdict(2.0, [0.5, 3.5], m3)           # tight interval, smaller than the resolution
    assert word == NO_DIFFERENCE and "below the minimum effect 3.0 points (given)" in reason
    word, reason = verdict(5.0, [-1.0, 11.0], m3)
    assert word == NO_DIFFERENCE and "contains 0" in reason
    measured = min_effect(None, seed_spread=2.0, grader_error=1.5)
    assert measured.points == pytest.approx(3.5) and "seed spread 2.0 + grader error 1.5" in measured.describe()
    word, reason = verdict(3.0, [1.0, 5.0], measured)
    assert word == NO_DIFFERENCE and "seed spread 2.0 + grader error 1.5" in reason
    nothing = min_effect(None)
    assert nothing.points == 0 and verdict(0.4, [0.1, 0.7], nothing)[0] == BETTER
    assert "no seed spread or grader audit measured" in verdict(0.4, [0.1, 0.7], nothing)[1]
    with pytest.raises(ValueError, match=">= 0 points"):
        min_effect(-1.0)


def test_seed_spread_is_the_sd_of_avg_at_n_across_seed_evaluations(tmp_path):
    dirs = [write_synthetic_eval(tmp_path / f"s{s}", model=f"/m/{s}", accuracy=a, seed=s)
            for s, a in enumerate((0.4, 0.5, 0.45))]
    values = [100 * json.loads((d / "summary.json").read_text())["tasks"]["gsm8k"]["avg@n"]["value"] for d in dirs]
    assert seed_spread(dirs) == pytest.approx(statistics.stdev(values))
    with pytest.raises(ValueError, match="at least two seeds"):
        seed_spread(dirs[:1])


def test_allocation_is_proportional_with_a_floor_of_one():
    # 280 graded correct, 744 wrong, n = 50: quotas 13.67 and 36.33 -> 14 and 36 (largest remainder)
    assert allocate({("t", True): 280, ("t", False): 744}, 50) == {("t", True): 14, ("t", False): 36}
    # a stratum of 2 out of 1000 still gets one of 10 draws
    assert allocate({("t", True): 2, ("t", False): 998}, 10) == {("t", True): 1, ("t", False): 9}
    assert allocate({("t", True): 3, ("t", False): 4}, 50) == {("t", True): 3, ("t", False): 4}


def test_wilson_interval_known_values():
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)  # Wilson's 0/10 upper bound
    low, high = wilson(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def copy_eval(tmp_path, name="base") -> Path:
    dst = tmp_path / name
    shutil.copytree(TINY_EVALS / name, dst)
    return dst


def test_audit_from_a_verdict_file_stratified_estimate(tmp_path, capsys):
    run = copy_eval(tmp_path)  # a real evalkit run of the tiny task: 280 of 1024 samples graded correct
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    sample = draw(records, 50, seed=0)
    assert sum(s["graded_correct"] for s in sample) == 14 and len({s["id"] for s in sample}) == 50
    assert sample == draw(records, 50, seed=0)  # seeded
    correct = [s["id"] for s in sample if s["graded_correct"]]
    wrong = [s["id"] for s in sample if not s["graded_correct"]]
    # the person disagrees with the grader on 2 of the 14 graded correct and 1 of the 36 graded wrong
    lines = [{"id": i, "correct": k >= 2} for k, i in enumerate(correct)]
    lines += [{"id": i, "correct": k == 0} for k, i in enumerate(wrong)]
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text("".join(json.dumps(v) + "\n" for v in lines))
    assert evalkit_main(["audit", str(run), "--n", "50", "--verdicts", str(verdicts)]) == 0
    out = capsys.readouterr().out
    audit = json.loads((run / "audit.json").read_text())
    expected = 280 / 1024 * 2 / 14 + 744 / 1024 * 1 / 36  # sum_h W_h e_h
    assert audit["judged"] == 50 and audit["error_rate"]["value"] == pytest.approx(expected)
    assert audit["error_rate"]["ci95"] == pytest.approx(list(wilson(expected * 50, 50)))
    assert audit["graded_correct"]["errors"] == 2 and audit["graded_wrong"]["errors"] == 1
    assert f"grader error rate: {100 * expected:.1f}%" in out and "false positives" in out
    assert audited_error([run]) == pytest.approx(100 * expected)
    # a different draw size over the stored sample is refused, naming the stored one
    with pytest.raises(RunDirError, match="drawn with --n 50 --seed 0"):
        run_audit(run, n=20, verdicts_file=verdicts)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "nope/1/0", "correct": True}) + "\n")
    assert evalkit_main(["audit", str(run), "--n", "50", "--verdicts", str(bad)]) == 2
    assert "not in the audit sample" in capsys.readouterr().err


def test_audit_typed_verdicts_resume(tmp_path):
    run = copy_eval(tmp_path)
    answers = iter(["y", "maybe", "n", "s", "q"])
    shown = []
    report = run_audit(run, n=6, read=lambda prompt: next(answers), write=shown.append)
    assert report["judged"] == 2 and "please type y, n, s or q" in shown
    assert len((run / "audit" / "verdicts.jsonl").read_text().splitlines()) == 2
    # the next session continues with the items not judged yet (the skipped one comes back first)
    more = iter(["y"] * 10)
    report = run_audit(run, n=6, read=lambda prompt: next(more), write=lambda s: None)
    assert report["judged"] == 6 and report["sampled"] == 6


def test_compare_takes_a_min_effect_and_measures_one(tmp_path, capsys):
    base, after = copy_eval(tmp_path, "base"), copy_eval(tmp_path, "grpo_after")
    assert evalkit_main(["compare", str(base), str(after), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    entry = plain["comparisons"][0]["tasks"]["tiny_arith"]["avg@n"]
    diff, ci = 100 * entry["difference"], [100 * x for x in entry["ci95"]]
    assert plain["min_effect"]["points"] == 0 and entry["verdict"] == verdict(diff, ci, min_effect(None))[0]
    big = abs(diff) + 1
    assert evalkit_main(["compare", str(base), str(after), "--json", "--min-effect", str(big)]) == 0
    entry = json.loads(capsys.readouterr().out)["comparisons"][0]["tasks"]["tiny_arith"]["avg@n"]
    assert entry["verdict"] == NO_DIFFERENCE
    # measured: the seed spread of --seed-runs plus the audited grader error of a compared run
    (after / "audit.json").write_text(json.dumps({"judged": 10, "error_rate": {"value": 0.02, "ci95": [0, 0.1]}}))
    seeds = [write_synthetic_eval(tmp_path / f"seed{s}", model=f"/m/{s}", accuracy=a, seed=s)
             for s, a in enumerate((0.3, 0.4))]
    assert evalkit_main(["compare", str(base), str(after), "--seed-runs", *map(str, seeds)]) == 0
    text = capsys.readouterr().out
    spread = seed_spread(seeds)
    assert f"minimum effect {spread + 2.0:.1f} points = seed spread {spread:.1f} + grader error 2.0" in text
    assert "## Verdicts at the experiment's resolution" in text

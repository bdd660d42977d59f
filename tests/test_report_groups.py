"""Seed groups in the report: which runs form a group, the mean and spread per group, group comparisons."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from rlhf_ext.report import collect, load_runs
from rlhf_ext.report.groups import GroupStat, compare, mean_curve, recipe_key, seed_groups
from rlhf_ext.report.series import moving_average
from rlhf_ext.report.synthetic import write_synthetic_eval, write_synthetic_run


def write_run(path: Path, scores, *, seed=0, lr=1e-6, commit="a" * 40):
    """A run record with ``train/score`` = ``scores`` at steps 1..n; everything else fixed."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"schema": "rlhf_ext.run/1", "name": path.name, "started_at": 1000.0 + seed,
              "args": {"algo.advantage.estimator": "grpo", "actor.adam.lr": lr, "train.seed": seed,
                       "ckpt.path": str(path / "ckpt"), "rlhf_ext.run_name": path.name},
              "plugin": {"version": "0.1.0"}, "git": {"commit": commit, "dirty": False, "cwd": str(path)}}
    (path / "config.json").write_text(json.dumps(config))
    (path / "metrics.jsonl").write_text("".join(
        json.dumps({"step": i, "time": 1000.0 + i, "elapsed_s": float(i), "train/score": v}) + "\n"
        for i, v in enumerate(scores, start=1)))
    (path / "events.jsonl").write_text(json.dumps({"event": "start", "step": 0, "time": 1000.0}) + "\n"
                                       + json.dumps({"event": "end", "step": len(scores), "time": 2000.0,
                                                     "status": "finished", "exit_code": 0}) + "\n")
    return path


def test_only_a_different_seed_makes_a_group(tmp_path):
    a0 = write_run(tmp_path / "grpo_s0", [0.1] * 4, seed=0)
    a1 = write_run(tmp_path / "grpo_s1", [0.2] * 4, seed=1)
    lr = write_run(tmp_path / "grpo_lr", [0.3] * 4, seed=2, lr=2e-6)       # another learning rate
    code = write_run(tmp_path / "grpo_code", [0.3] * 4, seed=3, commit="b" * 40)  # other code
    runs = load_runs([a0, a1, lr, code])
    assert recipe_key(runs[0].config) == recipe_key(runs[1].config) != recipe_key(runs[2].config)
    groups = seed_groups(runs, {r.name: "train/score" for r in runs}, window=2)
    assert [(g.name, g.runs, g.seeds) for g in groups] == [
        ("grpo", [0, 1], [0, 1]), ("grpo_lr", [2], [2]), ("grpo_code", [3], [3])]


def test_group_stats_and_comparison_hand_computed(tmp_path):
    # final 2 steps: a 0.2, 0.4, 0.6 -> mean 0.4, SD 0.2; b 0.7, 0.8, 0.9 -> mean 0.8, SD 0.1
    a = [write_run(tmp_path / f"a_seed{s}", [0.0, 0.0, v, v], seed=s) for s, v in enumerate((0.2, 0.4, 0.6))]
    b = [write_run(tmp_path / f"b_seed{s}", [0.0, 0.0, v, v], seed=s, lr=3e-6) for s, v in enumerate((0.7, 0.8, 0.9))]
    data = collect(a + b)
    assert [g.name for g in data.groups] == ["a", "b"] and data.window == 2
    ga, gb = data.groups
    assert ga.metric.values == pytest.approx([0.2, 0.4, 0.6]) and ga.metric.mean == pytest.approx(0.4)
    assert ga.metric.sd == pytest.approx(0.2) and gb.metric.sd == pytest.approx(0.1)
    (row,) = data.group_rows
    # Welch SE over seeds: sqrt(0.2^2/3 + 0.1^2/3) = 0.1291; 2 SE = 0.2582 < 0.4
    assert row.difference == pytest.approx(0.4) and row.se == pytest.approx(0.12910, abs=1e-5) and row.exceeds
    text = " ".join(data.headline)
    assert "a 0.4 \u00b1 0.2 (3 seeds); b 0.8 \u00b1 0.1 (3 seeds)" in text
    assert "b \u2212 a (seed groups): +0.4 in final-window batch pass rate, larger than the seed-to-seed spread" in text
    # with seed groups the page compares groups, not single runs against the first run
    assert "b_seed0 \u2212 a_seed0" not in text
    close = compare(GroupStat([0.4, 0.6]), GroupStat([0.5, 0.7]), "x", "y", "m")
    assert close.difference == pytest.approx(0.1) and close.exceeds is False  # 2 SE = 2 x 0.1414
    single = compare(GroupStat([0.4]), GroupStat([0.5, 0.7]), "x", "y", "m")
    assert single.se is None and single.exceeds is None


def test_no_groups_keeps_run_comparisons(tmp_path):
    runs = [write_run(tmp_path / "a", [0.1, 0.2, 0.3, 0.4]), write_run(tmp_path / "b", [0.1, 0.2, 0.3, 0.9], lr=2e-6)]
    data = collect(runs)
    assert [len(g.runs) for g in data.groups] == [1, 1] and data.group_rows[0].exceeds is None
    text = " ".join(data.headline)
    assert "b \u2212 a: " in text and "Seed groups" not in text and "(seed groups)" not in text


def test_mean_curve_over_seeds_and_a_seed_that_stopped_early(tmp_path):
    runs = load_runs([write_run(tmp_path / "s0", [0.0, 1.0, 2.0, 3.0], seed=0),
                      write_run(tmp_path / "s1", [2.0, 3.0, 4.0], seed=1)])
    curve = mean_curve(runs, "train/score", lambda v: moving_average(v, 2))
    # moving averages: s0 0, 0.5, 1.5, 2.5; s1 2, 2.5, 3.5 -> steps 1..3 in both
    assert curve["step"].tolist() == [1, 2, 3]
    assert curve["mean"] == pytest.approx([1.0, 1.5, 2.5]) and curve["min"] == pytest.approx([0.0, 0.5, 1.5])
    assert curve["max"] == pytest.approx([2.0, 2.5, 3.5])


def test_group_evaluations_use_each_seeds_last_evaluation(tmp_path):
    runs = [write_synthetic_run(tmp_path / f"g_seed{s}", steps=20, seed=s, mismatch=False) for s in range(2)]
    evals = tmp_path / "evals"
    accs = {0: 0.5, 1: 0.7}
    for s, acc in accs.items():
        write_synthetic_eval(evals / f"final{s}", model=tmp_path / f"g_seed{s}" / "final", accuracy=acc, seed=s)
    write_synthetic_eval(evals / "base", model="/models/base", accuracy=0.1, seed=9)  # step 0 of both: not the last
    data = collect(runs, [evals])
    (group,) = data.groups
    finals = []
    for s in accs:
        summary = json.loads((evals / f"final{s}" / "summary.json").read_text())
        (task,) = summary["tasks"]
        finals.append(summary["tasks"][task]["avg@n"]["value"])
    assert group.evals[task].values == pytest.approx(finals)
    assert group.evals[task].sd == pytest.approx(statistics.stdev(finals))
    assert np.isfinite(group.metric.mean)


def test_report_min_effect_from_the_seed_groups_or_given(tmp_path, capsys):
    from rlhf_ext.cli import main
    from rlhf_ext.evalkit.resolution import verdict

    evals = tmp_path / "evals"
    runs = []
    for g, (lr, accs) in enumerate(((1e-6, (0.40, 0.46)), (2e-6, (0.60, 0.62)))):
        for s, acc in enumerate(accs):
            run = write_run(tmp_path / f"g{g}_seed{s}", [0.1, 0.2, 0.3, 0.4], seed=s, lr=lr)
            cfg = json.loads((run / "config.json").read_text())
            cfg["args"]["ckpt.output_dir"] = str(run / "final")
            (run / "config.json").write_text(json.dumps(cfg))
            write_synthetic_eval(evals / run.name, model=run / "final", accuracy=acc, seed=10 * g + s)
            runs.append(run)
    data = collect(runs, [evals])
    sds = [g.evals["gsm8k"].sd for g in data.groups]
    pooled = 100 * ((sds[0] ** 2 + sds[1] ** 2) / 2) ** 0.5
    assert data.min_effect.points == pytest.approx(pooled) and data.min_effect.seed_spread == pytest.approx(pooled)
    for row in data.pairs:
        m = row.metrics["avg@n"]
        assert (m["verdict"], m["reason"]) == verdict(100 * m["difference"], [100 * x for x in m["ci95"]],
                                                      data.min_effect)
    assert any("Evaluation verdicts at the experiment's resolution (minimum effect" in h for h in data.headline)
    given = collect(runs, [evals], min_effect_points=100.0)
    assert {m["verdict"] for row in given.pairs for m in row.metrics.values()} == {"no difference"}
    assert main(["report", *map(str, runs), "--evals", str(evals), "--min-effect", "-2", "-o",
                 str(tmp_path / "r.html")]) == 2
    assert "--min-effect must be >= 0" in capsys.readouterr().err


def test_budget_cumulative_samples_and_tokens_hand_computed(tmp_path):
    run = tmp_path / "b"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"schema": "rlhf_ext.run/1", "name": "b", "started_at": 0.0,
                                                 "args": {"rollout.batch_size": 2, "rollout.n_samples_per_prompt": 4}}))
    rows = [{"step": 1, "rollout/num_samples": 8, "rollout/response_length_mean": 10.0},
            {"step": 2, "rollout/num_samples": 6, "rollout/response_length_mean": 5.0},
            {"step": 3, "rollout/num_samples": 8},                      # length unknown from here on
            {"step": 4, "rollout/num_samples": 8, "rollout/response_length_mean": 1.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "events.jsonl").write_text("")
    (record,) = load_runs([run])
    budget = record.budget()
    assert budget["samples"].tolist() == [8, 14, 22, 30]
    assert budget["tokens"][:2].tolist() == [80, 110] and np.isnan(budget["tokens"][2:]).all()
    # without rollout/num_samples: rollout.batch_size x n_samples_per_prompt per step
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    (record,) = load_runs([run])
    assert record.budget()["samples"].tolist() == [8, 16, 24] and "tokens" not in record.budget()

"""rlhf-ext report, data side: reading run records, config diffs, moving averages, downsampling,
placing and pairing evaluations, headline sentences (hand-computed cases and invariants)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rlhf_ext.evalkit.records import write_json_atomic
from rlhf_ext.report import (
    PANELS,
    RunRecordError,
    attribute,
    collect,
    diff_configs,
    difference_exceeds_noise,
    final_window,
    headline,
    incident_rows,
    load_eval,
    load_run,
    load_runs,
    minmax_downsample,
    moving_average,
    paired_rows,
    resolve,
    stride_downsample,
)
from rlhf_ext.report.configdiff import ABSENT, algorithm_summary
from rlhf_ext.report.evals import EvalDirError, find_eval_dirs
from rlhf_ext.report.series import WindowStats
from rlhf_ext.report.synthetic import write_synthetic_eval, write_synthetic_run

NAN = float("nan")


# --- moving average, downsampling, window statistics ---------------------------------------------


def test_moving_average_hand_computed():
    assert moving_average([1, 2, 3, 4], 2).tolist() == [1, 1.5, 2.5, 3.5]
    assert moving_average([1, 2, 3, 4], 3).tolist() == [1, 1.5, 2, 3]
    assert moving_average([1, 2, 3, 4], 10).tolist() == [1, 1.5, 2, 2.5]
    assert moving_average([5, 7], 1).tolist() == [5, 7]


def test_moving_average_skips_nan_and_never_invents_values():
    out = moving_average([1, NAN, 3, NAN, NAN, NAN], 2)
    assert out[:4].tolist() == [1, 1, 3, 3]
    assert math.isnan(out[4]) and math.isnan(out[5])  # a window with no finite value stays NaN
    assert np.isnan(moving_average([NAN, NAN], 3)).all()
    assert math.isnan(moving_average([1, NAN], 1)[1])


def test_moving_average_matches_a_direct_loop():
    rng = np.random.default_rng(0)
    x = rng.normal(size=300)
    x[rng.random(300) < 0.1] = np.nan
    for w in (1, 4, 17):
        expected = [np.nanmean(x[max(0, i - w + 1): i + 1]) if np.isfinite(x[max(0, i - w + 1): i + 1]).any()
                    else np.nan for i in range(len(x))]
        np.testing.assert_allclose(moving_average(x, w), expected, equal_nan=True)


@pytest.mark.parametrize("window", [0, -1, 2.5, True])
def test_moving_average_rejects_bad_windows(window):
    with pytest.raises(ValueError, match="window"):
        moving_average([1, 2], window)


def test_minmax_downsample_keeps_shape_spikes_and_ends():
    rng = np.random.default_rng(1)
    n = 10_000
    x = np.arange(n, dtype=float)
    y = rng.normal(size=n)
    y[4321] = 50.0  # a grad-norm spike
    y[777] = -40.0
    dx, dy = minmax_downsample(x, y, 800)
    assert len(dx) <= 800
    assert dx[0] == 0 and dx[-1] == n - 1
    assert np.all(np.diff(dx) > 0)
    assert dy.max() == 50.0 and dy.min() == -40.0
    np.testing.assert_array_equal(y[dx.astype(int)], dy)  # only original points, unchanged
    short_x, _ = minmax_downsample(x[:100], y[:100], 800)
    np.testing.assert_array_equal(short_x, x[:100])
    with pytest.raises(ValueError, match="max_points"):
        minmax_downsample(x, y, 3)
    with pytest.raises(ValueError, match="points"):
        minmax_downsample(x, y[:-1], 100)


def test_stride_downsample_even_spacing():
    x = np.arange(1001, dtype=float)
    dx, dy = stride_downsample(x, x * 2, 11)
    assert dx.tolist() == list(range(0, 1001, 100))
    np.testing.assert_array_equal(dy, dx * 2)


def test_window_stats_and_noise_test_hand_computed():
    a = final_window([1, 2, 3, 4, 5], [9, 9, 1, 2, 3], 3)
    assert (a.mean, a.sd, a.n, a.first_step, a.last_step) == (2.0, 1.0, 3, 3, 5)
    b = WindowStats(mean=5.0, sd=1.0, n=3, first_step=3, last_step=5)
    # Welch standard error sqrt(1/3 + 1/3) = 0.8165; |5 - 2| = 3 > 2 * 0.8165
    assert difference_exceeds_noise(a, b) is True
    c = WindowStats(mean=3.5, sd=1.0, n=3, first_step=3, last_step=5)  # 1.5 < 1.633
    assert difference_exceeds_noise(a, c) is False
    one = WindowStats(mean=1.0, sd=NAN, n=1, first_step=1, last_step=1)
    assert difference_exceeds_noise(a, one) is None
    assert final_window([1, 2], [NAN, NAN], 5) is None


# --- run records ---------------------------------------------------------------------------------


def write_run(path: Path, metrics_text: str, events=(), config=None):
    path.mkdir(parents=True, exist_ok=True)
    cfg = {"schema": "rlhf_ext.run/1", "name": path.name, "started_at": 1000.0,
           "args": {"algo.advantage.estimator": "grpo", "rollout.batch_size": 2, "rollout.n_samples_per_prompt": 4}}
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg))
    (path / "metrics.jsonl").write_text(metrics_text)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def lines(*objs):
    return "".join(json.dumps(o) + "\n" for o in objs)


def test_load_run_resume_torn_line_nonfinite_and_wall_clock(tmp_path):
    text = lines(
        {"step": 1, "elapsed_s": 10.0, "train/score": 0.1, "train/timing/generation": 4.0},
        {"step": 2, "elapsed_s": 20.0, "train/score": 0.2},
        {"step": 3, "elapsed_s": 30.0, "train/score": 0.9},   # redone after the resume: dropped
        # resumed from the checkpoint of step 2: the new process's clock starts again
        {"step": 3, "elapsed_s": 5.0, "train/score": 0.3, "train/policy_loss": None, "nonfinite": ["train/policy_loss"]},
        {"step": 4, "elapsed_s": 15.0, "train/score": 0.4, "train/policy_loss": 0.5, "note": "text is ignored"},
    ) + '{"step": 5, "elapsed_s": 25.0, "train/sc'  # torn by a crash
    run = write_run(tmp_path / "r", text, events=[{"event": "start", "step": 0}, {"event": "resume", "step": 3},
                                                  {"event": "end", "step": 4, "status": "finished", "exit_code": 0}])
    rec = load_run(run)
    assert rec.steps.tolist() == [1, 2, 3, 4]
    assert rec.metrics["train/score"].tolist() == [0.1, 0.2, 0.3, 0.4]  # last occurrence of step 3
    assert rec.metrics["timing/generation"][0] == 4.0  # TensorBoard-style key mapped to the record's
    assert rec.nonfinite == {"train/policy_loss": [3]}
    assert np.isnan(rec.metrics["train/policy_loss"][2]) and rec.metrics["train/policy_loss"][3] == 0.5
    assert "note" not in rec.metrics
    # wall clock: 10, 20, then the resumed segment continues from step 2's 20 s
    assert rec.wall_s.tolist() == [10.0, 20.0, 25.0, 35.0]
    assert rec.wall_time_s == 35.0
    assert (rec.status, rec.exit_code, rec.resumes) == ("finished", 0, [3])
    assert rec.warnings == []  # a torn last line is expected, not worth a warning


def test_load_run_reports_a_corrupt_middle_line_and_missing_step(tmp_path):
    text = lines({"step": 1, "train/score": 0.5}) + "{not json\n" + lines({"score": 1}, {"step": 2, "train/score": 1})
    rec = load_run(write_run(tmp_path / "r", text))
    assert rec.steps.tolist() == [1, 2]
    assert any("line 2" in w for w in rec.warnings)
    assert any("line 3" in w and "step" in w for w in rec.warnings)
    assert rec.status == "unknown" and any("events.jsonl" in w for w in rec.warnings)


def test_status_from_events(tmp_path):
    def status(events):
        return load_run(write_run(tmp_path / f"r{len(list(tmp_path.iterdir()))}", lines({"step": 1}), events)).status

    assert status([{"event": "start", "step": 0}]) == "running"
    assert status([{"event": "start"}, {"event": "end", "status": "stopped_by_guard", "exit_code": 3}]) == \
        "stopped_by_guard"
    assert status([{"event": "start"}, {"event": "end", "status": "crashed"}, {"event": "resume", "step": 5}]) == \
        "running"  # resumed after a crash and not ended yet


def test_tokens_generated_hand_computed(tmp_path):
    rec = load_run(write_run(tmp_path / "a", lines({"step": 1, "train/response_length": 10.0},
                                                   {"step": 2, "train/response_length": 20.0})))
    assert rec.tokens_generated() == (10 + 20) * 8  # batch 2 x 4 samples per prompt
    rec = load_run(write_run(tmp_path / "b", lines(
        {"step": 1, "rollout/response_length_mean": 5.0, "rollout/num_samples": 3.0},
        {"step": 2, "rollout/response_length_mean": 7.0, "rollout/num_samples": 4.0})))
    assert rec.tokens_generated() == 5 * 3 + 7 * 4
    assert load_run(write_run(tmp_path / "c", lines({"step": 1}))).tokens_generated() is None


def test_bad_run_directories_are_named(tmp_path):
    with pytest.raises(RunRecordError, match="not a directory"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunRecordError, match="config.json does not exist"):
        load_run(tmp_path / "empty")
    ev = tmp_path / "ev"
    write_json_atomic(ev / "config.json", {"suite": "gsm8k", "generation": {}})
    with pytest.raises(RunRecordError, match="evalkit output directory.*--evals"):
        load_run(ev)
    with pytest.raises(RunRecordError, match="newer"):
        load_run(write_run(tmp_path / "new", "", config={"schema": "rlhf_ext.run/2"}))
    with pytest.raises(RunRecordError, match="not an rlhf_ext run record"):
        load_run(write_run(tmp_path / "other", "", config={"schema": "wandb/1"}))
    a = write_run(tmp_path / "a", "")
    with pytest.raises(RunRecordError, match="2 names for 1"):
        load_runs([a], names=["x", "y"])
    assert [r.name for r in load_runs([a, a, a])] == ["a", "a #2", "a #3"]


# --- configuration diff --------------------------------------------------------------------------


def test_diff_configs_finds_the_differing_keys():
    base = {"args": {"algo.advantage.estimator": "grpo", "actor.adam.lr": 1e-6, "rollout.n_samples_per_prompt": 8,
                     "ckpt.path": "/ckpt/a", "algo.kl.init_coef": 0},
            "plugin": {"guard": "stop"}, "versions": {"torch": "2.13.0"}, "git": {"commit": "abc", "cwd": "/a"},
            "data_sha256": {"/data/a/train.jsonl": "f" * 64}, "started_at": 1, "name": "a"}
    other = json.loads(json.dumps(base))
    other["args"].update({"algo.advantage.estimator": "dr_grpo", "ckpt.path": "/ckpt/b", "algo.kl.init_coef": 0.0,
                          "actor.loss_agg_mode": "seq-mean-token-sum-norm"})
    other["git"]["cwd"] = "/b"
    other["data_sha256"] = {"/elsewhere/train.jsonl": "f" * 64}  # same content, another path
    other["name"], other["started_at"] = "b", 2
    d = diff_configs([base, other])
    assert d.keys == ["actor.loss_agg_mode", "algo.advantage.estimator"]
    assert d.values["algo.advantage.estimator"] == ["grpo", "dr_grpo"]
    assert d.values["actor.loss_agg_mode"][0] is ABSENT
    assert d.output_locations == 1  # ckpt.path differs but is not a setting
    assert diff_configs([base, base]).keys == []
    third = json.loads(json.dumps(base))
    third["versions"]["torch"] = "2.12.0"
    assert diff_configs([base, base, third]).keys == ["versions.torch"]


def test_algorithm_summary():
    s = algorithm_summary({"algo.advantage.estimator": "dr_grpo", "actor.loss_agg_mode": "seq-mean-token-sum-norm",
                           "algo.kl.init_coef": 0.001, "algo.kl.estimator": "k3", "algo.kl.use_loss": True,
                           "algo.kl.clip": None, "actor.eps_clip_low_high": [0.2, 0.28]})
    assert s == {"estimator": "dr_grpo", "policy loss": "ppo", "aggregation": "seq-mean-token-sum-norm",
                 "KL": "coef 0.001, k3, in loss, no clamp", "clip": "[0.2, 0.28]"}
    assert algorithm_summary({"algo.kl.init_coef": 0})["KL"] == "off (coef 0)"


# --- panels and headline -------------------------------------------------------------------------


def test_panels_note_missing_metrics_and_fall_back(tmp_path):
    a = write_synthetic_run(tmp_path / "a", steps=30, omit=["train/entropy_loss", "train/clip_frac_low",
                                                             "train/clip_frac_high"])
    b = write_synthetic_run(tmp_path / "b", steps=30, seed=1, mismatch=False,
                            omit=["train/entropy_loss", "train/clip_frac_low", "train/clip_frac_high"])
    runs = load_runs([a, b])
    by_id = {p.id: resolve(p, runs) for p in PANELS}
    assert by_id["entropy"].empty and "entropy_coef" in by_id["entropy"].note
    assert by_id["mismatch"].keys.keys() == {0} and by_id["mismatch"].note == "Not logged by b."
    clip = by_id["clip"]
    assert clip.panel.id == "clip_ratio" and not clip.empty and "train/clip_frac_low" in clip.note
    assert by_id["pass_rate"].keys == {0: ["train/score"], 1: ["train/score"]}


def test_rollout_correction_panel_draws_the_weight_statistics(tmp_path):
    text = lines(*({"step": i + 1, "rollout_corr/weight_mean": 0.98, "rollout_corr/ess": 0.97,
                    "rollout_corr/rejected_fraction": 0.01 * i, "rollout_corr/is_truncated_fraction": 0.0}
                   for i in range(4)))
    corrected = write_run(tmp_path / "corrected", text, events=[{"event": "start"}])
    plain = write_run(tmp_path / "plain", lines({"step": 1, "train/score": 0.5}), events=[{"event": "start"}])
    by_id = {p.id: resolve(p, load_runs([corrected, plain])) for p in PANELS}
    panel = by_id["rollout_correction"]
    assert panel.keys == {0: ["rollout_corr/weight_mean", "rollout_corr/ess", "rollout_corr/rejected_fraction",
                              "rollout_corr/is_truncated_fraction"]}
    assert panel.note == "Not logged by plain."


def test_headline_states_only_what_the_numbers_show(tmp_path):
    flat = [0.5, 0.5, 0.5, 0.5, 0.4, 0.6, 0.4, 0.6]
    better = [0.5, 0.5, 0.5, 0.5, 0.9, 0.8, 0.9, 0.8]
    runs = []
    for name, values in (("base", flat), ("better", better), ("same", flat[:-1] + [0.5])):
        text = lines(*({"step": i + 1, "train/score": v, "timing/step_total": 2.0} for i, v in enumerate(values)))
        runs.append(write_run(tmp_path / name, text, events=[{"event": "start"}, {"event": "end", "status": "finished"}]))
    out = headline(load_runs(runs), window=4)
    text = "\n".join(out)
    # final 4 steps: base 0.5 +- 0.1155, better 0.85 +- 0.0577, same 0.475 +- 0.0957
    assert "base 0.5 \u00b1 0.115 (steps 5\u20138)" in text and "better 0.85 \u00b1 0.0577" in text
    assert "better \u2212 base: +0.35 in final-window batch pass rate, larger than the step-to-step noise" in text
    assert "same \u2212 base: -0.025 in final-window batch pass rate, within the step-to-step noise" in text
    assert "better: batch pass rate went from 0.5 \u00b1 0 (steps 1\u20134) to 0.85" in text
    assert "Median time per step (timing/step_total): base 2 s" in text
    assert "different steps" not in text


def test_headline_mentions_lengths_running_and_guard(tmp_path):
    a = write_synthetic_run(tmp_path / "a", steps=40)
    b = write_synthetic_run(tmp_path / "b", steps=20, seed=1, status="running")
    c = write_synthetic_run(tmp_path / "c", steps=30, seed=2, status="stopped_by_guard", nonfinite_at=12)
    runs = load_runs([a, b, c])
    text = "\n".join(headline(runs))
    assert "different steps (a 40, b 20, c 12)" in text
    assert "b is still running" in text and "c was stopped by the non-finite guard at step 12" in text
    assert "1 guard incident(s)" in text and "1 non-finite metric value(s)" in text
    rows = incident_rows(runs)
    kinds = [(r, s, k) for r, s, k, _ in rows]
    assert ("b", 20, "no end record") in kinds and ("c", 12, "guard incident") in kinds
    assert ("c", 12, "non-finite metric") in kinds and ("c", 12, "end: stopped by guard") in kinds
    guard = next(d for r, s, k, d in rows if k == "guard incident")
    assert "non-finite loss on rank 0" in guard and "2 sample(s)" in guard


# --- evaluations ---------------------------------------------------------------------------------


@pytest.fixture
def two_runs_with_evals(tmp_path):
    a = write_synthetic_run(tmp_path / "grpo", steps=100, checkpoint_every=50)
    b = write_synthetic_run(tmp_path / "dr_grpo", steps=60, seed=1, estimator="dr_grpo")
    ev = tmp_path / "evals"
    write_synthetic_eval(ev / "base", model="/models/base", accuracy=0.3, seed=0)
    write_synthetic_eval(ev / "grpo50", model=tmp_path / "grpo" / "ckpt" / "global_step50_hf", accuracy=0.5, seed=1)
    write_synthetic_eval(ev / "grpo100", model=tmp_path / "grpo" / "ckpt" / "global_step100_hf", accuracy=0.6, seed=2)
    # no checkpoint events in run b: placed by the global_step directory and the final save
    write_synthetic_eval(ev / "nested" / "dr50", model=tmp_path / "dr_grpo" / "ckpt" / "_actor" / "global_step50",
                         accuracy=0.45, seed=3)
    write_synthetic_eval(ev / "dr_final", model=tmp_path / "dr_grpo" / "final", accuracy=0.5, seed=4)
    write_synthetic_eval(ev / "stray", model="/somewhere/else", accuracy=0.5, seed=5)
    return [a, b], ev


def test_evaluations_are_placed_on_runs_and_steps(two_runs_with_evals):
    run_dirs, ev = two_runs_with_evals
    runs = load_runs(run_dirs)
    paths = find_eval_dirs([ev])
    assert len(paths) == 6
    evals = [load_eval(p) for p in paths]
    points, unplaced = attribute(evals, runs)
    placed = sorted((runs[p.run].name, p.step, p.eval.path.name) for p in points)
    assert placed == [("dr_grpo", 0, "base"), ("dr_grpo", 50, "dr50"), ("dr_grpo", 60, "dr_final"),
                      ("grpo", 0, "base"), ("grpo", 50, "grpo50"), ("grpo", 100, "grpo100")]
    assert [(e.path.name, "neither" in why) for e, why in unplaced] == [("stray", True)]
    with pytest.raises(EvalDirError, match="no evalkit output"):
        find_eval_dirs([run_dirs[0]])


def test_paired_rows_reuse_evalkits_paired_bootstrap(two_runs_with_evals):
    run_dirs, ev = two_runs_with_evals
    runs = load_runs(run_dirs)
    evals = [load_eval(p) for p in find_eval_dirs([ev])]
    points, _ = attribute(evals, runs)
    rows = paired_rows(points, runs, resamples=500)
    labels = [(r.kind, r.baseline, r.other) for r in rows]
    # step 0 is the same evaluation for both runs: not compared with itself
    assert labels == [("between runs", "grpo @ step 50", "dr_grpo @ step 50"),
                      ("over training", "grpo @ step 0", "grpo @ step 100"),
                      ("over training", "dr_grpo @ step 0", "dr_grpo @ step 60")]
    # the difference is the mean over problems of the per-problem accuracy difference
    by_name = {e.path.name: e for e in evals}
    acc = {}
    for name in ("grpo50", "dr50"):
        recs = [json.loads(x) for x in (by_name[name].path / "samples.jsonl").read_text().splitlines()]
        per = {}
        for r in recs:
            per.setdefault(r["problem_id"], []).append(r["correct"])
        acc[name] = {k: sum(v) / len(v) for k, v in per.items()}
    expected = np.mean([acc["dr50"][k] - acc["grpo50"][k] for k in acc["grpo50"]])
    m = rows[0].metrics["avg@n"]
    assert m["difference"] == pytest.approx(expected)
    assert m["ci95"][0] <= m["difference"] <= m["ci95"][1]
    assert rows[0].problems == 40
    data = collect(run_dirs, [ev], resamples=200)
    assert any("paired bootstrap over 40 problems" in s for s in data.headline)


def test_evaluations_on_different_data_are_not_paired(tmp_path):
    a = write_synthetic_run(tmp_path / "a", steps=10, checkpoint_every=10)
    b = write_synthetic_run(tmp_path / "b", steps=10, seed=1, checkpoint_every=10)
    ea = write_synthetic_eval(tmp_path / "ea", model=tmp_path / "a" / "ckpt" / "global_step10_hf", accuracy=0.5)
    eb = write_synthetic_eval(tmp_path / "eb", model=tmp_path / "b" / "ckpt" / "global_step10_hf", accuracy=0.5)
    cfg = json.loads((eb / "config.json").read_text())
    cfg["datasets"]["gsm8k"]["sha256"] = "0" * 64
    write_json_atomic(eb / "config.json", cfg)
    runs = load_runs([a, b])
    points, _ = attribute([load_eval(ea), load_eval(eb)], runs)
    (row,) = [r for r in paired_rows(points, runs, resamples=100) if r.kind == "between runs"]
    assert "cannot be paired" in row.note and "different copies" in row.note


def test_headline_names_each_pair_of_runs_once_at_their_latest_common_step():
    from rlhf_ext.report.evals import PairRow

    def row(kind, step, runs, diff):
        return PairRow(kind=kind, task="gsm8k", baseline=f"a @ step {step}", other=f"b @ step {step}", problems=10,
                       metrics={"avg@n": {"baseline": 0.3, "run": 0.3 + diff, "difference": diff,
                                          "ci95": [diff - 0.05, diff + 0.05], "distinguishable": abs(diff) > 0.05}},
                       steps=(step, step), runs=runs)

    pairs = [row("between runs", 100, (0, 1), 0.01), row("between runs", 200, (0, 1), 0.1),
             row("over training", 200, (0, 0), 0.2)]
    text = "\n".join(headline([], pairs))
    assert "b @ step 200 \u2212 a @ step 200 = +10.0 points [+5.0, +15.0]" in text and "distinguishable" in text
    assert "step 100" not in text
    assert "+20.0 points" in text  # the over-training row is always stated


def test_a_hub_model_id_is_the_starting_model_of_the_runs_that_name_it(tmp_path):
    run = write_synthetic_run(tmp_path / "r", steps=5, extra_args={"actor.model_name_or_path": "Qwen/Qwen2.5-0.5B"})
    ev = load_eval(write_synthetic_eval(tmp_path / "ev", model="Qwen/Qwen2.5-0.5B", accuracy=0.3))
    points, unplaced = attribute([ev], load_runs([run]))
    assert [(p.run, p.step, p.how) for p in points] == [(0, 0, "starting model")] and unplaced == []


def test_headline_compares_every_run_on_one_metric(tmp_path):
    a = write_run(tmp_path / "a", lines(*({"step": i, "train/score": 0.5, "train/reward": 1.0} for i in range(1, 5))))
    b = write_run(tmp_path / "b", lines(*({"step": i, "train/reward": 0.2} for i in range(1, 5))))
    text = "\n".join(headline(load_runs([a, b])))
    assert "b logged no batch pass rate: left out of the comparisons below." in text
    assert "b \u2212 a" not in text and "a 0.5 \u00b1 0 (steps 3\u20134)" in text

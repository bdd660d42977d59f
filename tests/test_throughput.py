"""Throughput accounting: per step in the run record, per run in the report's table."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from rlhf_ext import runs
from rlhf_ext.patches.openrlhf import run_record as rr
from rlhf_ext.report import load_runs
from rlhf_ext.report.throughput_table import throughput_rows
from rlhf_ext.runs.throughput import step_throughput

TINY = Path(__file__).resolve().parent / "data" / "report_tiny" / "runs"


def test_step_throughput_hand_computed():
    values = {"timing/step_total": 4.0, "timing/generation": 3.0, "timing/broadcast": 0.5,
              "rollout/num_samples": 32, "rollout/response_length_mean": 10.0}
    assert step_throughput(values) == {"rlhf_ext/throughput/completion_tokens_per_s": 80.0,
                                       "rlhf_ext/throughput/wait_share": 0.75,
                                       "rlhf_ext/throughput/weight_sync_s": 0.5}
    assert step_throughput({"timing/step_total": 0.0, "timing/broadcast": 0.1}) == {
        "rlhf_ext/throughput/weight_sync_s": 0.1}
    assert step_throughput({}) == {}


def test_the_writer_records_them_per_step(tmp_path):
    writer = rr.RunWriter(tmp_path)
    writer.begin(0)
    writer.write_step(1, {"timing/step_total": 2.0, "timing/generation": 1.0, "rollout/num_samples": 8,
                          "rollout/response_length_mean": 5.0, "policy_loss": 0.1})
    (rec,) = runs.read_metrics(tmp_path / runs.METRICS)
    assert rec["rlhf_ext/throughput/completion_tokens_per_s"] == 20.0 and rec["rlhf_ext/throughput/wait_share"] == 0.5
    assert rec["train/policy_loss"] == 0.1


def test_report_table_from_real_tiny_runs_recomputed_by_hand():
    dirs = [TINY / "grpo", TINY / "dr_grpo"]
    rows = throughput_rows(load_runs(dirs))
    expected = []
    for d in dirs:
        recs = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        expected.append((statistics.median(r["timing/step_total"] for r in recs),
                         statistics.median(r["rollout/num_samples"] * r["rollout/response_length_mean"]
                                           / r["timing/step_total"] for r in recs),
                         statistics.median(r["timing/generation"] / r["timing/step_total"] for r in recs),
                         statistics.median(r["timing/broadcast"] for r in recs)))
    for row, (s, tok, wait, sync) in zip(rows, expected):
        assert row.s_per_step == pytest.approx(s) and row.tokens_per_s == pytest.approx(tok)
        assert row.wait_share == pytest.approx(wait) and row.weight_sync_s == pytest.approx(sync)
    assert rows[0].speed_vs_first == pytest.approx(1.0)
    assert rows[1].speed_vs_first == pytest.approx(expected[0][0] / expected[1][0])

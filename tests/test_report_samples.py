"""The sample viewer's data side: views per step and per task, prompts stored once, the page budget."""

from __future__ import annotations

import json

from rlhf_ext import runs
from rlhf_ext.evalkit.records import SampleLog
from rlhf_ext.report.samples import SampleSource, SampleView, eval_source, run_source, viewer_payload


def test_run_source_one_view_per_step_from_the_record(tmp_path):
    for step, reward in ((2, 1.0), (1, 0.0), (2, float("nan"))):
        runs.append_jsonl(tmp_path / runs.ROLLOUT_SAMPLES, runs.rollout_sample_record(
            step, prompt="q", response=f"a{step}", reward=reward, components={"reward/accuracy": reward},
            advantage=0.5, truncated=False, response_tokens=3, label="7"))
    with open(tmp_path / runs.ROLLOUT_SAMPLES, "ab") as f:
        f.write(b'{"step": 3, "prompt": "q", "resp')  # a torn last line
    source = run_source("run", tmp_path)
    assert [v.label for v in source.views] == ["step 1", "step 2"]
    assert [a["reward"] for a in source.views[1].answers] == [1.0, None]
    assert source.views[0].answers[0]["gold"] == "7" and source.views[0].answers[0]["advantage"] == 0.5
    assert run_source("none", tmp_path / "missing") is None


def test_eval_source_reward_is_correctness(tmp_path):
    with SampleLog(tmp_path / "samples.jsonl") as log:
        log.append([{"task": t, "problem_id": "p0", "sample_index": i, "prompt": "2+2?", "response": f"{3 + i}",
                     "correct": i == 1, "extracted": str(3 + i), "gold": "4", "truncated": False, "response_tokens": 1}
                    for t in ("math", "gsm8k") for i in range(2)])
    source = eval_source("ev", tmp_path)
    assert [v.label for v in source.views] == ["task gsm8k", "task math"]
    assert [(a["reward"], a["components"], a["extracted"]) for a in source.views[0].answers] == [
        (0.0, {"correct": 0.0}, "3"), (1.0, {"correct": 1.0}, "4")]


def test_payload_stores_prompts_once_and_shares_the_budget_across_steps():
    answer = {"response": "x" * 100, "reward": 1.0, "components": {}, "truncated": False}
    views = [SampleView(f"step {s}", [dict(answer, prompt=f"prompt {k}") for k in range(5)], s) for s in range(3)]
    payload, notes = viewer_payload([SampleSource("run", "run", views)], budget=10**6)
    assert len(payload["prompts"]) == 5 and len(payload["prompt_ids"]) == 5 and not notes
    assert [[a["p"] for a in v["answers"]] for v in payload["sources"][0]["views"]] == [[0, 1, 2, 3, 4]] * 3
    # a budget of about seven answers: the steps take turns, so each keeps two or three
    one = len(json.dumps(dict(answer, p=0)).encode())
    budget = 7 * one + 5 * 30
    payload, notes = viewer_payload([SampleSource("run", "run", views)], budget=budget)
    kept = [len(v["answers"]) for v in payload["sources"][0]["views"]]
    assert sum(kept) < 15 and max(kept) - min(kept) <= 1 and min(kept) >= 2
    assert notes == [f"sample viewer: run shows {sum(kept)} of its 15 recorded answers (the page keeps about "
                     f"{budget // 1024} KiB of answers per source)"]

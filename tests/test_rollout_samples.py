"""``rollout_samples.jsonl``: which rollouts are kept, what a line holds, the caps, resume, and the
PPOTrainer seam on real OpenRLHF Experience objects (built by OpenRLHF's own per-response code)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext import runs
from rlhf_ext.patches.openrlhf import rollout_samples as rs
from rlhf_ext.patches.openrlhf import run_record as rr


@pytest.fixture()
def fresh_state():
    rr._writer, rr._current_step = None, None
    rr._take_pending(), rr._take_events(), rr._deferred.clear()
    yield
    rr._writer, rr._current_step = None, None
    rr._take_pending(), rr._take_events(), rr._deferred.clear()


@pytest.fixture(scope="module")
def tokenizer():
    from rlhf_ext.evalkit.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_selection_takes_whole_groups_in_prompt_id_order_and_is_stable_across_steps():
    prompts = ["p1"] * 3 + ["p2"] * 3 + ["p3"] * 3
    order = sorted(["p1", "p2", "p3"], key=runs.prompt_id)
    first = runs.select_rollout_samples(prompts, 4)
    # the lowest-id prompt's whole group, then the next group's first answer
    assert [prompts[i] for i in first] == [order[0]] * 3 + [order[1]]
    assert first[:3] == [prompts.index(order[0]) + k for k in range(3)]
    # the same prompts in another order (a later step): the same prompt is chosen first
    later = list(reversed(prompts))
    assert {later[i] for i in runs.select_rollout_samples(later, 3)} == {order[0]}
    assert runs.select_rollout_samples(prompts, 0) == [] and len(runs.select_rollout_samples(prompts, 50)) == 9


def test_record_clips_long_texts_and_drops_nonfinite_numbers():
    rec = runs.rollout_sample_record(3, prompt="q" * 10, response="r" * 25, reward=float("nan"),
                                     components={"reward/accuracy": 1.0, "bad": float("inf")},
                                     advantage=torch.tensor(0.5), truncated=torch.tensor(True),
                                     response_tokens=7, label={"answer": 3}, text_chars=20)
    assert rec["prompt"] == "q" * 10 and rec["response"] == "r" * 20 and rec["clipped"] == {"response": 5}
    assert rec["reward"] is None and rec["components"] == {"reward/accuracy": 1.0, "bad": None}
    assert rec["advantage"] == 0.5 and rec["truncated"] is True and rec["label"] == '{"answer": 3}'
    assert rec["prompt_id"] == runs.prompt_id("q" * 10)


def _experiences(tokenizer, prompts, answers, rewards, advantages, truncated):
    """What ``make_experience_batch`` hands ``_compute_rollout_stats``: OpenRLHF's own per-response
    Experiences, concatenated as its experience maker does, with the advantages it computes."""
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    singles = []
    for prompt, answer, reward, cut in zip(prompts, answers, rewards, truncated):
        p_ids = tokenizer(prompt)["input_ids"]
        a_ids = tokenizer(answer)["input_ids"] + ([] if cut else [tokenizer.eos_token_id])
        response = {"observation_tokens": p_ids + a_ids, "action_ranges": [(len(p_ids), len(p_ids) + len(a_ids))],
                    "reward": reward, "scores": float(reward > 0), "prompt": prompt, "label": "7",
                    "extra_logs": {"reward/accuracy": float(reward > 0), "reward/format": 0.2},
                    "truncated": cut, "rollout_log_probs": None}
        singles.append(SamplesGenerator._process_response_into_experience(SimpleNamespace(), response, max_len=1024))
    batch = Experience.concat_experiences(singles, tokenizer.pad_token_id)
    batch.advantages = batch.action_mask.float() * torch.tensor(advantages).unsqueeze(1)
    # step-level values rlhf_ext's patches copy into every row: not reward components
    n = len(prompts)
    batch.info.update({"advantage_std": torch.full((n,), 0.5), "zero_variance_group_frac": torch.zeros(n),
                       "rollout_mismatch/probs_diff_mean": torch.full((n,), 0.01)})
    return [batch]


def _trainer(run_dir, tokenizer, per_step=2, total=3):
    args = SimpleNamespace(rlhf_ext=SimpleNamespace(run_dir=str(run_dir), rollout_samples=per_step,
                                                    rollout_samples_total=total))
    return SimpleNamespace(args=args, tokenizer=tokenizer)


def _real_rollout_stats():
    from openrlhf.trainer.ppo_trainer import BasePPOTrainer

    fn = BasePPOTrainer._compute_rollout_stats
    return getattr(fn, "__wrapped__", fn)  # OpenRLHF's own, whether or not this process patched it


def test_the_seam_records_decoded_answers_with_reward_components_advantage_and_caps(tmp_path, tokenizer, fresh_state,
                                                                                    plugin_driver):
    stats = rs.make_compute_rollout_stats(_real_rollout_stats())
    trainer = _trainer(tmp_path, tokenizer)
    rr._writer = rr.RunWriter(tmp_path)
    rr._writer.begin(0)
    prompts = ["What is 3+4?", "What is 3+4?", "Name a prime."]
    answers = ["The answer is 7.", "It is 8", "2"]
    exps = _experiences(tokenizer, prompts, answers, [1.2, 0.0, 1.0], [0.7, -0.7, 0.0], [False, True, False])
    rr._current_step = 1
    out = stats(trainer, exps)
    assert out["rollout/num_samples"] == 3.0  # OpenRLHF's own result, untouched
    lines = runs.read_rollout_samples(tmp_path / runs.ROLLOUT_SAMPLES)
    assert runs.prompt_id(prompts[0]) < runs.prompt_id(prompts[2])  # so the 3+4 group is the one kept
    a, b = lines
    assert (a["prompt"], a["response"], a["reward"], a["advantage"], a["truncated"]) == (
        "What is 3+4?", "The answer is 7.", pytest.approx(1.2), pytest.approx(0.7), False)
    assert (b["prompt"], b["response"], b["reward"], b["advantage"], b["truncated"]) == (
        "What is 3+4?", "It is 8", 0.0, pytest.approx(-0.7), True)
    assert a["components"] == {"reward/accuracy": 1.0, "reward/format": pytest.approx(0.2)}
    assert b["components"]["reward/accuracy"] == 0.0
    assert a["response_tokens"] == len(tokenizer("The answer is 7.")["input_ids"]) + 1  # + the EOS token
    assert a["label"] == "7" and a["step"] == 1 and a["prompt_id"] == runs.prompt_id("What is 3+4?")
    # step 2: one more fits under the total cap of 3, then an event says the file is full
    rr._current_step = 2
    stats(trainer, exps)
    lines = runs.read_rollout_samples(tmp_path / runs.ROLLOUT_SAMPLES)
    assert [r["step"] for r in lines] == [1, 1, 2]
    full = [e for e in runs.read_jsonl(tmp_path / runs.EVENTS) if e["event"] == "rollout_samples_full"]
    assert full == [pytest.approx({"event": "rollout_samples_full", "step": 2, "total": 3, "cap": 3, "time": full[0]["time"]})]
    rr._current_step = 3
    stats(trainer, exps)
    assert len(runs.read_rollout_samples(tmp_path / runs.ROLLOUT_SAMPLES)) == 3
    # a resume from the step-1 checkpoint drops step 2's samples, and counts the kept ones against the cap
    rr._writer = rr.RunWriter(tmp_path)
    rr._writer.begin(1)
    assert [r["step"] for r in runs.read_rollout_samples(tmp_path / runs.ROLLOUT_SAMPLES)] == [1, 1]
    assert rr._writer.samples_written == 2


def test_off_with_zero_and_a_failure_is_an_event_not_a_crash(tmp_path, tokenizer, fresh_state, plugin_driver):
    stats = rs.make_compute_rollout_stats(_real_rollout_stats())
    rr._writer = rr.RunWriter(tmp_path)
    rr._writer.begin(0)
    rr._current_step = 1
    exps = _experiences(tokenizer, ["a?"], ["b"], [1.0], [0.0], [False])
    stats(_trainer(tmp_path, tokenizer, per_step=0), exps)
    assert not (tmp_path / runs.ROLLOUT_SAMPLES).exists()

    class BrokenTokenizer:
        def decode(self, *a, **k):
            raise RuntimeError("no vocabulary")

    out = stats(_trainer(tmp_path, BrokenTokenizer()), exps)
    assert out["rollout/num_samples"] == 1.0
    (event,) = [e for e in runs.read_jsonl(tmp_path / runs.EVENTS) if e["event"] == "rollout_samples_error"]
    assert event["step"] == 1 and "no vocabulary" in event["error"]


def test_the_flags_refuse_negative_caps(parse):
    with pytest.raises(SystemExit):
        parse("--rlhf_ext.rollout_samples", "-1")
    with pytest.raises(SystemExit):
        parse("--rlhf_ext.rollout_samples_total", "0")
    args = parse("--rlhf_ext.rollout_samples", "0")
    assert rs.per_step_cap(args) == 0 and rs.total_cap(args) == runs.SAMPLES_TOTAL


def test_runs_show_names_the_samples_and_the_mfu(tmp_path):
    runs.write_json_atomic(tmp_path / runs.CONFIG, {"name": "r", "compute": {
        "device": "cpu", "device_count": 1, "mfu_unavailable": "no peak-FLOPs figure for device 'cpu'"}})
    runs.append_jsonl(tmp_path / runs.METRICS, {"step": 1})
    for step in (1, 3):
        runs.append_jsonl(tmp_path / runs.ROLLOUT_SAMPLES, runs.rollout_sample_record(step, prompt="q", response="a",
                                                                                     reward=1.0))
    text = runs.summarize(tmp_path)
    assert "rollout samples: 2 in rollout_samples.jsonl, steps 1..3" in text
    assert "MFU: none (no peak-FLOPs figure for device 'cpu')" in text
    runs.write_json_atomic(tmp_path / runs.CONFIG, {"name": "r", "compute": {
        "device": "NVIDIA H200", "device_count": 8, "mfu_unavailable": None}})
    for step, mfu in ((1, 0.1), (2, 0.3)):
        runs.append_jsonl(tmp_path / runs.METRICS, {"step": step, "rlhf_ext/throughput/mfu": mfu})
    assert "MFU of the policy update: median 20% over 2 steps (NVIDIA H200 x 8)" in runs.summarize(tmp_path)

"""OpenRLHF's async trainer and multi-turn agents with the plugin (issue 38, items 4 and 5).

* async: the policy version travels from the trainer's weight sync to the generator's batch and
  back to the step's ``rlhf_ext/policy_lag`` (OpenRLHF's real ``SamplesGenerator.generate_samples``
  with its buffer, real ``Experience`` objects through a pickle as Ray's queue sends them), and
  the rollout correction / mismatch metrics use vLLM's log-probs of the stale policy as they came
  with the samples;
* agents: OpenRLHF's real ``MultiTurnAgentExecutor`` running ``examples/openrlhf/agent_two_turn_math.py``
  (a scripted engine stands in for vLLM, which the end-to-end runs use), OpenRLHF's own response ->
  ``Experience`` code, then rlhf_ext's estimators, losses, rollout correction and
  ``rollout_samples.jsonl``: the environment's feedback tokens carry no advantage and no loss;
* bad input: an agent file that raises, at import (driver, before Ray) or in ``step`` (rollout actor).

``check_async_run`` and ``check_agent_run`` are the assertions for the lead's end-to-end mode matrix.
"""

from __future__ import annotations

import asyncio
import math
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlhf_ext import runs
from rlhf_ext.patches.openrlhf import policy_lag

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_AGENT = ROOT / "examples" / "openrlhf" / "agent_two_turn_math.py"
ASYNC_FLAGS = ("--train.async_enable", "--train.async_queue_size", "2")
AGENT_FLAGS = ("--train.agent_func_path", str(EXAMPLE_AGENT), "--data.max_len", "96")
CORRECTION_FLAGS = ("--rlhf_ext.rollout_is", "token", "--rlhf_ext.rollout_is_threshold", "2.0")


@pytest.fixture(scope="module")
def openrlhf(plugin_driver):
    """OpenRLHF's modules with the plugin's patches applied (the plugin active in this process)."""
    from openrlhf.trainer.ppo_utils import experience_maker, samples_generator
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ray import ppo_actor, vllm_engine

    return SimpleNamespace(em=experience_maker, sg=samples_generator, Experience=Experience, actor=ppo_actor,
                           vllm_engine=vllm_engine)


@pytest.fixture(scope="module")
def tokenizer():
    from rlhf_ext.evalkit.tiny_model import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture()
def fresh_board(monkeypatch):
    monkeypatch.setattr(policy_lag, "_local_version", None)
    monkeypatch.setattr(policy_lag, "_warned", False)


def _response(tokenizer, prompt_ids, answer_ids, rollout_lp):
    return {"observation_tokens": prompt_ids + answer_ids, "action_ranges": [(len(prompt_ids), len(prompt_ids) +
            len(answer_ids))], "reward": 1.0, "scores": 1.0, "prompt": "p", "label": "7", "extra_logs": {},
            "truncated": False, "rollout_log_probs": [0.0] * len(prompt_ids) + rollout_lp}


# ------------------------------------------------------------------ async: the policy lag


def test_lag_stats_hand_computed():
    # trainer at version 3; samples from versions 1, the run's start (0), 3 and 2
    stats = policy_lag.lag_stats(3, [1, None, 3, 2], start_version=0)
    assert stats == {policy_lag.LAG_KEY: (2 + 3 + 0 + 1) / 4, policy_lag.LAG_MAX_KEY: 3.0}
    assert policy_lag.lag_stats(5, [None, None], start_version=5) == {policy_lag.LAG_KEY: 0.0,
                                                                      policy_lag.LAG_MAX_KEY: 0.0}
    assert policy_lag.lag_stats(1, [], start_version=0) == {}


def _generator(openrlhf, tokenizer, *, async_on, over_sample=1):
    """A ``SamplesGenerator`` whose vLLM call makes one real ``Experience`` per sample (4 prompts x 2)."""
    args = SimpleNamespace(train=SimpleNamespace(async_enable=async_on),
                           rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=2,
                                                   vllm_generate_batch_size=2 * over_sample),
                           vllm=SimpleNamespace(enable_sleep=False), algo=SimpleNamespace(dynamic_filtering_enable=False))
    gen = SimpleNamespace(args=args, prompts_dataloader=list(range(100)))
    made = []

    def _generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **kw):
        exps = []
        for _ in range(num_prompts * args.rollout.n_samples_per_prompt):
            exps.append(openrlhf.sg.SamplesGenerator._process_response_into_experience(
                gen, _response(tokenizer, [5, 6], [7, 8, 9], [-0.5, -0.25, -1.0]), max_len=64))
        made.extend(exps)
        return exps, num_prompts, False

    gen._generate_vllm = _generate_vllm
    return gen, made


def _trainer(async_on):
    calls = []

    def broadcast(self):  # OpenRLHF's broadcast_to_vllm: the weights reach vLLM
        calls.append("sync")

    trainer = SimpleNamespace(args=SimpleNamespace(train=SimpleNamespace(async_enable=async_on)))
    trainer.broadcast_to_vllm = lambda: policy_lag.make_broadcast_to_vllm(broadcast)(trainer)

    def train_step(self, rollout_samples, global_step):  # OpenRLHF's: train, then broadcast
        self.broadcast_to_vllm()
        return {"reward": 1.0}, global_step + 1

    return trainer, policy_lag.make_train_step(train_step), calls


def test_async_versions_flow_from_the_weight_sync_to_the_steps_lag(openrlhf, tokenizer, fresh_board):
    gen, _ = _generator(openrlhf, tokenizer, async_on=True)
    generate = openrlhf.sg.SamplesGenerator.generate_samples  # patched (policy_lag) around OpenRLHF's own
    trainer, train_step, syncs = _trainer(async_on=True)
    queue = []

    def produce():  # GenerateSamplesActor.fit: generate inside the VLLMLock, then put into the Ray queue
        samples = generate(gen)[0]
        queue.append(pickle.dumps(samples))

    produce(), produce()  # queue size 2: both batches from the starting weights
    statuses = []
    for step in range(3):
        samples = pickle.loads(queue.pop(0))
        status, _ = train_step(trainer, samples, step)
        statuses.append(status)
        produce()  # the slot freed: the next batch, from whatever vLLM holds now
    assert syncs == ["sync"] * 3 and policy_lag.read() == 3
    lags = [(s[policy_lag.LAG_KEY], s[policy_lag.LAG_MAX_KEY]) for s in statuses]
    # step 1: batch 1 (start weights) -> 0; step 2: batch 2 (start weights, trainer at 1) -> 1;
    # step 3: batch 3 generated after step 1's sync (version 1), trainer at 2 -> 1
    assert lags == [(0.0, 0.0), (1.0, 1.0), (1.0, 1.0)]
    assert all(s["reward"] == 1.0 for s in statuses)  # OpenRLHF's own status kept


def test_a_step_mixing_generations_reports_mean_and_max(openrlhf, tokenizer, fresh_board):
    # --rollout.vllm_generate_batch_size 2x the batch: one vLLM call feeds two steps from OpenRLHF's buffer
    gen, made = _generator(openrlhf, tokenizer, async_on=True, over_sample=2)
    generate = openrlhf.sg.SamplesGenerator.generate_samples
    first = generate(gen)[0]  # generated now (version None = start); the other half waits in the buffer
    policy_lag.publish(4)
    second = generate(gen)[0]  # served from the buffer: still the start version, though vLLM now holds 4
    assert len(made) == 8 and len(first) == len(second) == 4
    assert {getattr(e, policy_lag.STAMP_ATTR) for e in first + second} == {None}
    third = generate(gen)[0]  # a new vLLM call: version 4
    assert {getattr(e, policy_lag.STAMP_ATTR) for e in third} == {4}
    trainer, train_step, _ = _trainer(async_on=True)
    trainer.__dict__[policy_lag.START_ATTR] = 3
    status, _ = train_step(trainer, second[:2] + third[:2], 5)
    assert status[policy_lag.LAG_KEY] == pytest.approx((2 * (5 - 3) + 2 * (5 - 4)) / 4)
    assert status[policy_lag.LAG_MAX_KEY] == 2.0


def test_sync_runs_are_untouched(openrlhf, tokenizer, fresh_board):
    gen, _ = _generator(openrlhf, tokenizer, async_on=False)
    samples = openrlhf.sg.SamplesGenerator.generate_samples(gen)[0]
    assert samples and not any(hasattr(e, policy_lag.STAMP_ATTR) for e in samples)
    trainer, train_step, syncs = _trainer(async_on=False)
    status, step = train_step(trainer, samples, 0)
    assert status == {"reward": 1.0} and step == 1 and syncs == ["sync"] and policy_lag.read() is None


def test_async_rollouts_without_versions_warn_once_and_log_nothing(openrlhf, tokenizer, fresh_board, capfd):
    gen, _ = _generator(openrlhf, tokenizer, async_on=False)  # a generator without the plugin's stamps
    samples = openrlhf.sg.SamplesGenerator.generate_samples(gen)[0]
    trainer, train_step, _ = _trainer(async_on=True)
    assert policy_lag.LAG_KEY not in train_step(trainer, samples, 0)[0]
    assert policy_lag.LAG_KEY not in train_step(trainer, samples, 1)[0]
    assert capfd.readouterr().err.count("carry no policy version") == 1


def test_correction_and_mismatch_use_vllms_stale_log_probs(openrlhf, tokenizer):
    """vLLM's log-probs of the behaviour (stale) policy reach the mismatch metrics and the correction
    unchanged, after the batch went through the rollout queue: with the trainer's current log-probs
    differing by a known ``delta`` both measure exactly that delta. Had anything recomputed the
    rollout log-probs with the current weights, the weights would all be 1 and the mismatch 0."""
    from rlhf_ext.algorithms import RolloutCorrection, get_policy_loss
    from rlhf_ext.patches.openrlhf.mismatch import step_metrics
    from rlhf_ext.patches.openrlhf.rollout_correction import corrected_loss

    stale = [-0.5, -0.25, -1.0]
    exp = openrlhf.sg.SamplesGenerator._process_response_into_experience(
        SimpleNamespace(), _response(tokenizer, [5, 6], [7, 8, 9], stale), max_len=64)
    exp = pickle.loads(pickle.dumps(exp))  # Ray's queue between the generator and the trainer
    mask = exp.action_mask.bool()
    assert exp.rollout_log_probs[mask].tolist() == stale  # exactly what vLLM returned
    delta = torch.tensor([0.1, -0.2, 1.0])
    current = exp.rollout_log_probs.clone()
    current[mask] += delta  # the trainer's weights moved on since generation (the lag)
    exp.action_log_probs = current
    metrics = step_metrics([exp])
    assert metrics["rollout_mismatch/logprobs_abs_diff_mean"] == pytest.approx(float(delta.abs().mean()), rel=1e-5)
    assert metrics["rollout_mismatch/k1_kl"] == pytest.approx(float(-delta.mean()), rel=1e-5)
    _, corr, vllm_kl, _ = corrected_loss(get_policy_loss("noclip"), {}, (RolloutCorrection(is_level="token",
                                         is_threshold=2.0), False), current.clone().requires_grad_(), current,
                                         torch.ones_like(current), exp.action_mask, exp.rollout_log_probs)
    weights = [min(math.exp(d), 2.0) for d in delta.tolist()]
    assert float(corr["rollout_corr/weight_mean"]) == pytest.approx(sum(weights) / 3, rel=1e-5)
    assert float(vllm_kl) == pytest.approx(float(-delta.mean()), rel=1e-5)


# ------------------------------------------------------------------ agents: masks, samples, reward


class ScriptedEngine:
    """Stands in for OpenRLHF's ``RolloutRayActor.generate`` (vLLM): each call returns the next answer's
    tokens, text, finish reason and per-token log-probs in vLLM's output layout."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.calls = tokenizer, list(answers), 0

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        text = self.answers[self.calls]
        self.calls += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        logprobs = [{t: SimpleNamespace(logprob=-0.1 * (k + 1))} for k, t in enumerate(ids)]
        out = SimpleNamespace(token_ids=ids, text=text, finish_reason="stop", logprobs=logprobs)
        return SimpleNamespace(outputs=[out])


PROMPT = "<|im_start|>user\nWhat is 6 + 6?<|im_end|>\n<|im_start|>assistant\n"
# (turn 1, turn 2) per sample of one prompt group: final answers right, right, wrong, wrong
ANSWERS = [("\\boxed{12}", "\\boxed{12}"), ("\\boxed{11}", "\\boxed{12}"), ("\\boxed{12}", "\\boxed{13}"),
           ("no idea", "\\boxed{7}")]


def _agent_responses(openrlhf, tokenizer, agent_path=EXAMPLE_AGENT):
    executor = openrlhf.vllm_engine._load_agent_executor(str(agent_path))  # patched: guarded execute
    out = []
    for first, second in ANSWERS:
        params = SimpleNamespace(logprobs=1, max_tokens=None)
        out.append(asyncio.run(executor.execute(PROMPT, "12", params, 256, tokenizer,
                                                ScriptedEngine(tokenizer, [first, second]))))
    return out


def _agent_batch(openrlhf, tokenizer):
    responses = _agent_responses(openrlhf, tokenizer)
    singles = [openrlhf.sg.SamplesGenerator._process_response_into_experience(SimpleNamespace(), r, max_len=256)
               for r in responses]
    batch = openrlhf.Experience.concat_experiences(singles, tokenizer.pad_token_id)
    batch.index = list(range(len(singles)))
    batch.kl = torch.zeros_like(batch.action_mask, dtype=torch.float32)
    return responses, batch


def _feedback_positions(batch, tokenizer):
    """Bool [B, T-1] (action_mask's layout): the environment's tokens between and after the turns."""
    seq = batch.sequences[:, 1:]
    att = batch.attention_mask[:, 1:].bool()
    first = batch.action_mask.float().argmax(dim=1, keepdim=True)
    after_start = torch.arange(seq.shape[1])[None, :] >= first
    return after_start & att & ~batch.action_mask.bool()


def _maker(openrlhf, estimator, **advantage):
    em = openrlhf.em
    maker = em.RemoteExperienceMaker.__new__(em.RemoteExperienceMaker)
    maker.advantage_estimator = estimator
    maker.kl_ctl = SimpleNamespace(value=0.0)
    adv = dict(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False, **advantage)
    maker.strategy = SimpleNamespace(args=SimpleNamespace(
        rollout=SimpleNamespace(n_samples_per_prompt=4), reward=SimpleNamespace(clip_range=None),
        algo=SimpleNamespace(advantage=SimpleNamespace(**adv))))
    return maker


def test_the_example_agent_runs_two_turns_with_rlhf_ext_rewards(openrlhf, tokenizer):
    responses = _agent_responses(openrlhf, tokenizer)
    # math = accuracy + 0.2 answer format of the final turn; the first turn earns 0
    assert [r["reward"] for r in responses] == pytest.approx([1.2, 1.2, 0.2, 0.2])
    assert [float(r["scores"]) for r in responses] == [1.0, 1.0, 0.0, 0.0]
    assert [float(r["extra_logs"]["agent/first_turn_correct"]) for r in responses] == [1.0, 0.0, 1.0, 0.0]
    assert all(len(r["action_ranges"]) == 2 for r in responses)
    text = tokenizer.decode(responses[1]["observation_tokens"])
    assert "Not quite. Final answer?" in text and text.count("<|im_start|>assistant") == 2


@pytest.mark.parametrize("estimator,options", [("grpo", {}), ("passk", {"passk_k": 2, "input": "score"})])
def test_feedback_tokens_get_no_advantage(openrlhf, tokenizer, estimator, options):
    from rlhf_ext.algorithms import grpo, passk

    _, batch = _agent_batch(openrlhf, tokenizer)
    feedback = _feedback_positions(batch, tokenizer)
    assert int(feedback.sum(dim=1).min()) > 0  # every sample has feedback tokens between its turns
    out = _maker(openrlhf, estimator, **options).compute_advantages_and_returns([batch])[0]
    assert torch.equal(out.advantages[feedback], torch.zeros(int(feedback.sum())))
    assert torch.equal(out.advantages[~batch.action_mask.bool()], torch.zeros(int((~batch.action_mask.bool()).sum())))
    expected = (grpo(torch.tensor([[1.2, 1.2, 0.2, 0.2]])) if estimator == "grpo"
                else passk(torch.tensor([[1.0, 1.0, 0.0, 0.0]]), k=2))[0]
    for i in range(4):  # both turns of a sample carry its outcome advantage
        torch.testing.assert_close(out.advantages[i][batch.action_mask[i].bool()],
                                   expected[i].expand(int(batch.action_mask[i].sum())))


def _compact(t, mask):
    """Only the model's tokens of each row, left-aligned (the same rows without any feedback token)."""
    rows = [t[i][mask[i]] for i in range(t.shape[0])]
    out = torch.zeros(t.shape[0], max(len(r) for r in rows), dtype=t.dtype)
    keep = torch.zeros_like(out, dtype=torch.bool)
    for i, r in enumerate(rows):
        out[i, :len(r)], keep[i, :len(r)] = r, True
    return out, keep


@pytest.mark.parametrize("loss_type,mode,correction", [
    ("noclip", "token-mean", "sequence"), ("cispo", "seq-mean-token-mean", "token"),
    ("ppo", "seq-mean-token-sum-norm", None)])
def test_feedback_tokens_carry_no_loss(openrlhf, tokenizer, loss_type, mode, correction):
    """The policy loss and its gradient are those of the same rows with the feedback tokens removed;
    the feedback tokens' gradient is 0. vLLM's dummy 0.0 log-probs on them would move a sequence-level
    correction weight by exp(sum of the trainer's log-probs there) if they were counted."""
    from rlhf_ext.algorithms import RolloutCorrection

    _, batch = _agent_batch(openrlhf, tokenizer)
    mask = batch.action_mask.bool()
    g = torch.Generator().manual_seed(0)
    old = torch.where(mask, batch.rollout_log_probs + 0.05 * torch.randn(mask.shape, generator=g),
                      -3.0 - torch.rand(mask.shape, generator=g))  # the trainer's log-probs of every token
    new = old + 0.1 * torch.randn(mask.shape, generator=g)
    adv = torch.where(mask, torch.tensor([[0.5], [0.5], [-0.5], [-0.5]]), torch.randn(mask.shape, generator=g))

    def loss_of(new_, old_, adv_, mask_, rollout_):
        fn = openrlhf.actor.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, policy_loss_type=loss_type)
        fn.configure(mode, max_len=64)
        if correction:  # what --rlhf_ext.rollout_is LEVEL configures on a registered loss
            fn.rollout_correction = (RolloutCorrection(is_level=correction, is_threshold=2.0), False)
        x = new_.clone().requires_grad_()
        loss = fn(x, old_, adv_, action_mask=mask_, rollout_log_probs=rollout_)[0]
        loss.backward()
        return loss.detach(), x.grad

    loss, grad = loss_of(new, old, adv, mask, batch.rollout_log_probs)
    feedback = _feedback_positions(batch, tokenizer)
    assert torch.equal(grad[~mask], torch.zeros(int((~mask).sum())))
    assert bool((grad[mask] != 0).any())
    c_new, keep = _compact(new, mask)
    c_loss, c_grad = loss_of(c_new, _compact(old, mask)[0], _compact(adv, mask)[0], keep,
                             _compact(batch.rollout_log_probs, mask)[0])
    torch.testing.assert_close(loss, c_loss)
    torch.testing.assert_close(grad[mask], c_grad[keep])
    # the check can fail: had OpenRLHF's action mask reached the feedback tokens, the loss would differ
    leaked, _ = loss_of(new, old, adv, mask | feedback, batch.rollout_log_probs)
    assert not torch.allclose(leaked, loss)


def test_mismatch_metrics_count_only_the_models_tokens(openrlhf, tokenizer):
    from rlhf_ext.patches.openrlhf.mismatch import step_metrics

    _, batch = _agent_batch(openrlhf, tokenizer)
    mask = batch.action_mask.bool()
    batch.action_log_probs = torch.where(mask, batch.rollout_log_probs, torch.full(mask.shape, -5.0))
    metrics = step_metrics([batch])  # trainer == vLLM on the model's tokens; feedback's dummy 0.0 must not count
    assert metrics["rollout_mismatch/tokens"] == int(mask.sum())
    assert metrics["rollout_mismatch/logprobs_abs_diff_max"] == 0.0


def test_rollout_samples_record_the_turns(openrlhf, tokenizer, tmp_path):
    from rlhf_ext.patches.openrlhf.rollout_samples import sample_records, turn_spans

    # action_mask[t] is sequences[t + 1]: attention [1] * 9 + [0] leaves the last mask position as padding
    assert turn_spans(torch.tensor([0, 0, 1, 1, 0, 0, 1, 0, 0]), torch.tensor([1] * 9 + [0])) == [
        ("assistant", 2, 4), ("environment", 4, 6), ("assistant", 6, 7), ("environment", 7, 8)]
    assert turn_spans(torch.tensor([0, 1, 1, 0]), torch.tensor([1, 1, 1, 1, 0])) == [("assistant", 1, 3)]
    _, batch = _agent_batch(openrlhf, tokenizer)
    batch.advantages = batch.action_mask.float()
    records = sample_records(1, [batch], tokenizer, cap=8)
    assert len(records) == 4
    for rec in records:
        roles = [t["role"] for t in rec["turns"]]
        assert roles[:3] == ["assistant", "environment", "assistant"]
        assert "Final answer?" in rec["turns"][1]["text"]
        assert sum(t["tokens"] for t in rec["turns"] if t["role"] == "assistant") == rec["response_tokens"]
    by_first = {r["turns"][0]["text"]: r for r in records}
    assert "Not quite." in by_first["\\boxed{11}"]["turns"][1]["text"]
    assert by_first["\\boxed{11}"]["turns"][2]["text"] == "\\boxed{12}"
    assert by_first["\\boxed{11}"]["components"]["agent/first_turn_correct"] == 0.0
    line = runs.rollout_sample_record(1, prompt="p", response="r", reward=1.0, turns=records[0]["turns"])
    runs.append_jsonl(tmp_path / runs.ROLLOUT_SAMPLES, line)
    assert runs.read_rollout_samples(tmp_path / runs.ROLLOUT_SAMPLES)[0]["turns"] == records[0]["turns"]


def test_agent_reward_hand_computed_never_raises():
    from rlhf_ext.rewards import agent_reward

    math_reward = agent_reward("rlhf_ext:math")
    out = math_reward({"action_text": "so \\boxed{12}<|im_end|>", "label": "12"})
    assert isinstance(out["rewards"], torch.Tensor) and out["rewards"].dtype == torch.float32
    assert float(out["rewards"]) == pytest.approx(1.2) and float(out["scores"]) == 1.0  # accuracy 1 + format 0.2
    assert float(out["extra_logs"]["reward/accuracy"]) == 1.0 and float(out["extra_logs"]["reward_flag/error"]) == 0.0
    cut = math_reward({"action_text": "\\boxed{12}", "label": "12"}, truncated=True)
    assert float(cut["rewards"]) == pytest.approx(1.2 - 0.5)  # the truncation penalty, when the agent says so
    weighted = agent_reward("accuracy:1.0,format:0.2")
    assert float(weighted(text="\\boxed{3}", label="4")["rewards"]) == 0.0
    assert set(weighted(text="x", label="4")["extra_logs"]) == set(out["extra_logs"]) - {
        "reward/answer_format", "reward/truncation"} | {"reward/format"}
    for bad in ({"action_text": None, "label": "1"}, None, {"action_text": 5}):
        broken = math_reward(bad)
        assert float(broken["rewards"]) == 0.0 and float(broken["extra_logs"]["reward_flag/error"]) == 1.0
        assert set(broken["extra_logs"]) == set(out["extra_logs"])  # same keys: OpenRLHF concatenates them
    for spec in ("rlhf_ext:nosuch", "rlhf_ext:", 3):
        with pytest.raises(ValueError, match="agent_reward"):
            agent_reward(spec)


def test_agent_reward_acall_grades_off_the_event_loop_with_the_same_result():
    """``await reward.acall(states)`` (the form an ``async def step`` uses): the grading runs in a worker thread,
    so the rollout actor's loop, which generates every other episode, is never the thread that grades."""
    import asyncio
    import threading

    from rlhf_ext.rewards import agent_reward

    reward = agent_reward("rlhf_ext:math")
    states = {"action_text": "so \\boxed{12}<|im_end|>", "label": "12"}
    graded_on = []
    scorer_call = reward.scorer.score_responses

    def spy(*args, **kwargs):
        graded_on.append(threading.get_ident())
        return scorer_call(*args, **kwargs)

    reward.scorer.score_responses = spy

    async def step():
        return threading.get_ident(), await reward.acall(states), await reward.acall({"action_text": None})

    loop_thread, out, broken = asyncio.run(step())
    direct = reward(states)
    assert float(out["rewards"]) == float(direct["rewards"]) == pytest.approx(1.2)
    assert {k: float(v) for k, v in out["extra_logs"].items()} == {k: float(v) for k, v in direct["extra_logs"].items()}
    assert float(broken["extra_logs"]["reward_flag/error"]) == 1.0  # never raises, in the thread either
    assert len(graded_on) == 2 and graded_on[0] != loop_thread == graded_on[1]  # acall: a worker; direct: here


# ------------------------------------------------------------------ bad input: an agent file that raises


RAISES_AT_IMPORT = "import os\nTABLE = {}\nvalue = TABLE['missing']\n"
RAISES_IN_STEP = '''
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor


class AgentInstance(AgentInstanceBase):
    def __init__(self, *args, **kwargs):
        pass

    async def step(self, states, **kwargs):
        return {"rewards": 1 / 0}


class AgentExecutor(MultiTurnAgentExecutor):
    def __init__(self):
        super().__init__(AgentInstance)
'''


def test_an_agent_file_that_raises_at_import_stops_the_driver_in_one_line(parse, capfd, tmp_path):
    bad = tmp_path / "agent.py"
    bad.write_text(RAISES_AT_IMPORT)
    with pytest.raises(SystemExit) as exc:
        parse("--train.agent_func_path", str(bad))
    assert exc.value.code == 2
    lines = [ln for ln in capfd.readouterr().err.splitlines() if "error:" in ln]
    assert lines == [f"train_ppo_ray.py: error: --train.agent_func_path {bad}: importing it raised KeyError: "
                     "'missing' (in <module>() at line 3: value = TABLE['missing'])"]
    for text, message in (("x = 1\n", "defines no AgentExecutor"), ("AgentExecutor = int\n", "must derive from")):
        bad.write_text(text)
        with pytest.raises(SystemExit):
            parse("--train.agent_func_path", str(bad))
        assert message in capfd.readouterr().err
    with pytest.raises(SystemExit):
        parse("--train.agent_func_path", str(tmp_path / "nope.py"))
    assert "no such file" in capfd.readouterr().err


def test_a_good_agent_file_passes_with_its_absolute_path(parse, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = parse("--train.agent_func_path", "examples/openrlhf/agent_two_turn_math.py")
    assert args.train.agent_func_path == str(EXAMPLE_AGENT)


def test_an_agent_that_raises_in_step_names_the_file_line_and_exception(openrlhf, tokenizer, tmp_path):
    from rlhf_ext.patches.openrlhf.agents import AgentFileError

    bad = tmp_path / "agent.py"
    bad.write_text(RAISES_IN_STEP)
    with pytest.raises(AgentFileError) as err:
        _agent_responses(openrlhf, tokenizer, bad)
    assert str(err.value) == (f"--train.agent_func_path {bad}: the agent raised ZeroDivisionError: division by zero "
                              "(in step() at line 10: return {\"rewards\": 1 / 0})")
    assert err.value.__suppress_context__  # the driver's last line is this one, not the bare ZeroDivisionError
    assert str(pickle.loads(pickle.dumps(err.value))) == str(err.value)  # Ray sends it to the trainer
    bad.write_text(RAISES_IN_STEP.replace('{"rewards": 1 / 0}', '{"rewards": __import__("torch").tensor(1.0)}'))
    with pytest.raises(AgentFileError, match="OpenRLHF's executor could not use what the agent returned: KeyError: "
                                             "'environment_feedback'"):
        _agent_responses(openrlhf, tokenizer, bad)
    bad.write_text(RAISES_AT_IMPORT)  # a file that changed after the driver's check
    with pytest.raises(AgentFileError, match=r"loading it in a rollout actor raised KeyError: 'missing' \(in <module>"):
        openrlhf.vllm_engine._load_agent_executor(str(bad))


# ------------------------------------------------------------------ the lead's mode matrix


def _record(work: Path, output: str = "trained") -> Path:
    from rlhf_ext.tours.smoke import run_record_dir

    return run_record_dir(work / output)


def check_async_run(work: Path, rc: int, text: str, *, output: str = "trained", queue_size: int = 2,
                    correction: bool = True) -> None:
    """Assertions on a finished ``--train.async_enable --train.async_queue_size Q`` run of the smoke
    command (``rlhf_ext.tours.smoke.train_command(output=work / output, ...)``) with >= 2 steps."""
    from rlhf_ext.tours.smoke import parse_train_log

    assert rc == 0, text[-3000:]
    steps = parse_train_log(text).steps
    assert len(steps) >= 2, text[-3000:]
    lags = [s.get(policy_lag.LAG_KEY) for s in steps]
    assert all(v is not None and 0 <= v <= queue_size for v in lags), lags
    assert lags[0] == 0  # the first batch comes from the starting weights
    # with Q >= 2 the generator fills the queue before step 1's sync: step 2 trains on a stale batch
    assert max(s[policy_lag.LAG_MAX_KEY] for s in steps) >= 1, lags
    record = _record(work, output)
    metrics = runs.read_metrics(record / runs.METRICS)
    assert [m["step"] for m in metrics] == [s["global_step"] for s in steps]
    assert all(isinstance(m.get(policy_lag.LAG_KEY), (int, float)) for m in metrics)
    assert "policy lag (async)" in runs.summarize(record)
    config = __import__("json").loads((record / runs.CONFIG).read_text())
    assert config["args"].get("train.async_enable") is True
    if correction:  # vLLM's stale log-probs reached the correction: weights logged, not all exactly 1
        assert all("rollout_corr/weight_mean" in m for m in metrics)
        assert all("rollout_mismatch/probs_diff_mean" in m for m in metrics)


def check_agent_run(work: Path, rc: int, text: str, *, output: str = "trained") -> None:
    """Assertions on a finished run with ``--train.agent_func_path examples/openrlhf/agent_two_turn_math.py``."""
    from rlhf_ext.tours.smoke import parse_train_log

    assert rc == 0, text[-3000:]
    steps = parse_train_log(text).steps
    assert len(steps) >= 2 and all("reward" in s for s in steps), text[-3000:]
    record = _record(work, output)
    samples = runs.read_rollout_samples(record / runs.ROLLOUT_SAMPLES)
    assert samples, "no rollout samples recorded"
    multi = [r for r in samples if r.get("turns")]
    assert multi, "no sample recorded its turns"
    for rec in multi:
        roles = [t["role"] for t in rec["turns"]]
        assert roles[0] == "assistant" and "environment" in roles
        assert all(a != b for a, b in zip(roles, roles[1:]))  # segments alternate
        assert any("Final answer?" in t["text"] for t in rec["turns"] if t["role"] == "environment")
        assert "agent/first_turn_correct" in rec["components"] and "reward/accuracy" in rec["components"]
    config = __import__("json").loads((record / runs.CONFIG).read_text())
    assert str(config["args"].get("train.agent_func_path", "")).endswith("agent_two_turn_math.py")


def test_the_mismatch_warning_names_the_lag_in_async_runs():
    from rlhf_ext.patches.openrlhf.mismatch import warning_message

    assert "policy lag" in warning_message(0.01, 0.005, 2, async_mode=True)
    assert "policy lag" not in warning_message(0.01, 0.005, 2)

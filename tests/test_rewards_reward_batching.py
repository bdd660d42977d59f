"""Issue 15, part 1: OpenRLHF's per-sample reward calls, graded in shared batches by the plugin.

The scorer's batched path against its per-call path (same numbers, per-call semantics kept), and the
patched ``SingleTurnAgentExecutor._fetch_rewards_via_func`` of the real OpenRLHF 0.11.2, activated
by the plugin's start-up hook in a fresh process as in a rollout actor.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rlhf_ext.rewards.config import RewardConfig
from rlhf_ext.rewards.openrlhf_protocol import RewardScorer

PROMPT = "<|im_start|>user\nWhat is 6 x 7?<|im_end|>\n<|im_start|>assistant\n"
ANSWERS = ["\\boxed{42}", "\\boxed{41}", "The answer is 42.", "no idea", "<answer>42</answer>", "\\boxed{42"]


@pytest.mark.parametrize("spec", ["math", "open_r1", "accuracy:1.0,cosine:0.5,repetition_penalty:0.1"])
def test_score_calls_of_per_sample_rewards_merge_the_calls_and_split_them_exactly(spec):
    queries = [PROMPT + "y" * (2 * i) + a + ("<|im_end|>" if i % 4 else "") for i, a in enumerate(ANSWERS * 4)]
    calls = [([q], [PROMPT], ["42"]) for q in queries] + [(queries[:3], [PROMPT] * 3, ["42", "41", "42"])]
    calls.insert(5, (["bad"], [PROMPT], ["42", "43"]))  # lengths differ: this call alone is an error
    scorer = RewardScorer(RewardConfig(reward=spec, workers=2))
    try:
        assert scorer.reward.per_sample
        together = scorer.score_calls(calls)
        alone = [scorer.score(*call) for call in calls]
    finally:
        scorer.close()
    assert together == alone
    assert together[5]["extra_logs"]["reward_flag/error"] == [1.0]


def test_score_calls_gives_each_call_what_score_gives_it():
    queries = [PROMPT + "x" * (3 * i) + a + ("<|im_end|>" if i % 5 else "") for i, a in enumerate(ANSWERS * 4)]
    calls = [([q], [PROMPT], ["42"]) for q in queries]
    calls.append((queries[:3], [PROMPT] * 3, ["42", "41", "42"]))  # a call of several samples
    calls.append(([None], [PROMPT], ["42"]))  # malformed: scored alone and reported
    scorer = RewardScorer(RewardConfig(reward="accuracy:1.0,length:1.0,answer_format:0.2", workers=2))
    try:
        assert not scorer.reward.per_sample  # length is relative to its batch
        together = scorer.score_calls(calls)
        alone = [scorer.score(*call) for call in calls]
    finally:
        scorer.close()
    assert together == alone
    assert together[-1]["rewards"] == [0.0] and together[-1]["extra_logs"]["reward_flag/error"] == [1.0]
    # `length` is relative to the lengths in its own call: 0 for one-sample calls, not for the 3-sample one
    assert all(out["extra_logs"]["reward/length"] == [0.0] for out in together[:-2])
    assert together[-2]["extra_logs"]["reward/length"] != [0.0, 0.0, 0.0]


CHILD = textwrap.dedent(
    """
    import asyncio, json, sys
    import openrlhf.utils.agent as agent
    from rlhf_ext.patches.openrlhf import reward_batching
    from rlhf_ext.rewards.path import reward_file_path

    prompt, answers, other_file = json.loads(sys.argv[1])
    method = agent.SingleTurnAgentExecutor._fetch_rewards_via_func
    original = method.__wrapped__  # OpenRLHF's own, kept by functools.wraps

    async def many(executor, fetch):
        queries = [prompt + a + "<|im_end|>" for a in answers]
        outs = await asyncio.gather(*(fetch(executor, [q], [prompt], ["42"]) for q in queries))
        return [[float(o[0]["rewards"]), float(o[0]["scores"]), {k: float(v) for k, v in o[0]["extra_logs"].items()}]
                for o in outs]

    ours = agent.SingleTurnAgentExecutor(reward_file_path())
    patched = asyncio.run(many(ours, method))
    theirs = asyncio.run(many(agent.SingleTurnAgentExecutor(reward_file_path()), original))
    batcher = next(iter(ours._rlhf_ext_reward_batchers.values()))[1]
    plain = agent.SingleTurnAgentExecutor(other_file)
    plain_out = asyncio.run(many(plain, method))
    print(json.dumps({"patched": patched, "original": theirs, "stats": batcher.stats,
                      "is_patched": method is not original, "plain": plain_out,
                      "plain_batched": hasattr(plain, "_rlhf_ext_reward_batchers")}))
    """
)


def test_the_plugin_batches_openrlhfs_per_sample_reward_calls_with_the_same_results(tmp_path):
    other = tmp_path / "my_reward.py"
    other.write_text("import torch\n"
                     "def reward_func(queries, prompts, labels, **kw):\n"
                     "    r = torch.tensor([float(len(q) % 3) for q in queries])\n"
                     "    return {'rewards': r, 'scores': r, 'extra_logs': {}}\n")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, RLHF_EXT_PLUGINS="rlhf_ext", RLHF_EXT_QUIET="1", RLHF_EXT_REWARD="math",
               TOKENIZERS_PARALLELISM="false")
    answers = ANSWERS * 10
    res = subprocess.run([sys.executable, str(script), json.dumps([PROMPT, answers, str(other)])],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["is_patched"]
    assert out["patched"] == out["original"]  # every sample: rewards, scores and every log, exactly
    assert [s for _, s, _ in out["patched"]][:6] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert out["stats"]["calls"] == len(answers) and out["stats"]["batches"] < len(answers)
    # any other reward file goes through OpenRLHF's own method
    assert not out["plain_batched"] and [r for r, _, _ in out["plain"]] == [
        float(len(PROMPT + a + "<|im_end|>") % 3) for a in answers]


def test_reward_func_calls_returns_what_reward_func_returns_per_call(monkeypatch):
    """The batched reward file entry point gives each call exactly ``reward_func(*call)``'s tensors (values,
    dtype, shape, keys), a call of several samples and a malformed call included."""
    import torch

    from rlhf_ext.rewards import openrlhf_protocol, openrlhf_reward

    monkeypatch.setenv("RLHF_EXT_REWARD", "math")
    monkeypatch.setenv("RLHF_EXT_REWARD_WORKERS", "1")
    monkeypatch.setattr(openrlhf_protocol, "_env_scorer", None)
    queries = [PROMPT + "z" * i + a + ("<|im_end|>" if i % 3 else "") for i, a in enumerate(ANSWERS * 2)]
    calls = [([q], [PROMPT], ["42"]) for q in queries]
    calls.insert(2, (queries[:3], [PROMPT] * 3, ["42", "42", "42"]))
    calls.insert(4, (["bad"], [PROMPT], ["42", "43"]))  # lengths differ: scored 0 and reported
    try:
        together = openrlhf_reward.reward_func_calls(calls)
        alone = [openrlhf_reward.reward_func(*call) for call in calls]
    finally:
        openrlhf_protocol.scorer_from_env().close()
        monkeypatch.setattr(openrlhf_protocol, "_env_scorer", None)
    assert len(together) == len(calls)
    for got, want in zip(together, alone):
        assert list(got["extra_logs"]) == list(want["extra_logs"])
        for g, w in [(got["rewards"], want["rewards"]), (got["scores"], want["scores"])] + [
                (got["extra_logs"][k], want["extra_logs"][k]) for k in want["extra_logs"]]:
            if isinstance(w, float):  # a one-sample call's logs are floats (openrlhf_reward._tensors)
                assert type(g) is float and g == w and len(want["rewards"]) == 1
                continue
            assert g.dtype == w.dtype == torch.float32 and g.shape == w.shape and torch.equal(g, w)
    assert together[2]["scores"].tolist() == [1.0, 0.0, 1.0]
    assert together[4]["extra_logs"]["reward_flag/error"] == 1.0
    assert together[2]["extra_logs"]["reward_flag/error"].tolist() == [0.0, 0.0, 0.0]  # three samples: tensors
    # each call's tensors own their storage (views of one storage shared by all calls would each pickle all
    # of it when OpenRLHF sends the outputs through Ray)
    for got, call in zip(together, calls):
        own = (2 + len(got["extra_logs"])) * len(call[0]) * 4
        for t in [got["rewards"], got["scores"], *got["extra_logs"].values()]:
            assert isinstance(t, float) or t.untyped_storage().nbytes() <= own

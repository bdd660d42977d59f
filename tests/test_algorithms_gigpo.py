"""GiGPO (rlhf_ext.algorithms.gigpo, arXiv 2505.10978): hand-computed cases, a worked example in the paper's
setting (one task, four trajectories revisiting states), parity with a reference re-implemented from ROLL's
``roll/pipeline/agentic/utils.py`` (compute_discounted_returns, agentic_reward_norm, build_state_group,
compute_response_level_rewards) on random inputs, the OpenRLHF glue's bookkeeping, and the other hosts'
start-up refusals."""

import asyncio
import math
import random
from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import get_advantage, host_inputs
from rlhf_ext.algorithms.gigpo import discounted_returns, gigpo, gigpo_turn_advantages, group_relative


def test_discounted_returns_and_group_relative_hand_computed():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([1.0, 2.0], 1.0) == [3.0, 2.0]
    assert group_relative(torch.tensor([3.0]), "std").tolist() == [0.0]  # a group of one: no comparison
    assert group_relative(torch.tensor([1.0, 3.0]), "none").tolist() == [-1.0, 1.0]
    std = group_relative(torch.tensor([1.0, 3.0]), "std")
    assert std.tolist() == pytest.approx([-1 / (math.sqrt(2) + 1e-6), 1 / (math.sqrt(2) + 1e-6)])
    assert group_relative(torch.tensor([2.0, 2.0, 2.0]), "std").tolist() == [0.0, 0.0, 0.0]


def worked_example():
    """One task, four trajectories (gamma 0.5, omega 1, F = 1, the paper's agent default):

    t1: s0 -> s1 -> s2, reward 1 at the last turn     returns 0.25, 0.5, 1
    t2: s0 -> s1 -> s3, no reward                       returns 0, 0, 0
    t3: s0 -> s4, reward 1 at the second turn           returns 0.5, 1
    t4: s0 -> s5, no reward                             returns 0, 0

    episode: scores 1, 0, 1, 0 -> A^E = +-0.5. Anchor s0 (all four first turns): returns 0.25, 0, 0.5, 0,
    mean 0.1875 -> A^S 0.0625, -0.1875, 0.3125, -0.1875. Anchor s1 (t1 and t2): 0.5, 0 -> +-0.25. The
    other anchors are visited once: A^S = 0. So the first turn of t3 (reached the goal faster) gets more
    credit than t1's, and t1's second turn (from s1 to the goal) more than t2's (from s1 to a dead end)."""
    turns = [[[(0.0, "s0"), (0.0, "s1"), (1.0, "s2")],
              [(0.0, "s0"), (0.0, "s1"), (0.0, "s3")],
              [(0.0, "s0"), (1.0, "s4")],
              [(0.0, "s0"), (0.0, "s5")]]]
    return torch.tensor([[1.0, 0.0, 1.0, 0.0]]), turns


def test_worked_example():
    scores, turns = worked_example()
    per_turn, metrics = gigpo_turn_advantages(scores, turns, gamma=0.5, norm="none")
    expected = [[0.5625, 0.75, 0.5], [-0.6875, -0.75, -0.5], [0.8125, 0.5], [-0.6875, -0.5]]
    for got, want in zip(per_turn[0], expected):
        assert got.tolist() == pytest.approx(want)
    assert metrics["gigpo/anchor_group_size"].item() == pytest.approx(10 / 6)  # s0: 4, s1: 2, four of one
    assert metrics["gigpo/shared_turn_frac"].item() == pytest.approx(0.6)
    # the weights: step-level only, episode-level only
    only_step, _ = gigpo_turn_advantages(scores, turns, gamma=0.5, norm="none", episode_weight=0.0)
    assert only_step[0][1].tolist() == pytest.approx([-0.1875, -0.25, 0.0])
    only_episode, _ = gigpo_turn_advantages(scores, turns, gamma=0.5, norm="none", step_weight=0.0)
    assert only_episode[0][2].tolist() == pytest.approx([0.5, 0.5])


def test_registered_by_name_pads_turns_and_refuses_without_them():
    scores, turns = worked_example()
    assert get_advantage("gigpo") is gigpo and host_inputs(gigpo) == ("turns",)
    out = get_advantage("gigpo")(scores, turns=turns, gamma=0.5)
    assert out.shape == (1, 4, 3)
    assert out[0, 2].tolist() == pytest.approx([0.8125, 0.5, 0.0])  # padded past the last turn
    with pytest.raises(ValueError, match="needs turns="):
        gigpo(scores)
    with pytest.raises(ValueError, match="grouped like the scores"):
        gigpo(scores, turns=turns[0][:2])
    with pytest.raises(ValueError, match="unknown norm"):
        gigpo(scores, turns=turns, norm="minmax")


def test_groups_never_span_prompts_and_one_trajectory_revisiting_is_not_shared():
    scores = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    turns = [[[(0.0, "x"), (1.0, "x")], [(0.0, "y")]],
             [[(0.0, "x")], [(1.0, "y")]]]
    per_turn, metrics = gigpo_turn_advantages(scores, turns, gamma=1.0, norm="none")
    # prompt 0: anchor x holds t0's two turns (returns 1, 1): no difference; prompt 1: x and y apart
    assert per_turn[0][0].tolist() == pytest.approx([0.5, 0.5])
    assert per_turn[1][0].tolist() == pytest.approx([-0.5])
    assert metrics["gigpo/shared_turn_frac"].item() == 0.0


# --- reference re-implemented from ROLL (step samples, group_by dicts) -----------------------------------


def roll_reference(scores, turns, gamma, norm, w_e, w_s):
    """ROLL's pipeline on step samples: one sample per turn with traj_group_id, traj_id, step, state_hash,
    step_scores and episode_scores; reward_normalization mean (norm none) or mean_std (norm std)."""
    samples = []
    for p, row in enumerate(turns):
        for n, traj in enumerate(row):
            for t, (r, anchor) in enumerate(traj):
                samples.append(dict(group=p, traj=(p, n), step=t, state=anchor, step_score=r,
                                    episode_score=float(scores[p][n])))
    for traj in {s["traj"] for s in samples}:  # compute_discounted_returns
        steps = sorted((s for s in samples if s["traj"] == traj), key=lambda s: s["step"])
        running = 0.0
        for s in reversed(steps):
            running = s["step_score"] + gamma * running
            s["step_return"] = running

    def norm_by(key, value):  # agentic_reward_norm with norm_mean_type=group, norm_std_type=group or None
        out = {}
        groups = {}
        for i, s in enumerate(samples):
            groups.setdefault(key(s), []).append(i)
        for idx in groups.values():
            x = torch.tensor([value(samples[i]) for i in idx])
            mean = x.mean()
            if norm == "std":
                std = x.std() if x.numel() > 1 else torch.tensor(0.0)
                y = (x - mean) / (std + 1e-6) if x.numel() > 1 and std.abs() > 1e-6 else torch.zeros_like(x)
            else:
                y = x - mean if x.numel() > 1 else torch.zeros_like(x)
            for i, v in zip(idx, y.tolist()):
                out[i] = v
        return out

    # episode level: ROLL groups the step samples by traj_group_id; each trajectory must count once, so the
    # reference normalises over trajectories (ROLL's step-sample batch repeats equal scores per step)
    traj_scores = {}
    for s in samples:
        traj_scores[s["traj"]] = s["episode_score"]
    trajs = sorted(traj_scores)
    ep = {}
    for p in {t[0] for t in trajs}:
        members = [t for t in trajs if t[0] == p]
        x = torch.tensor([traj_scores[t] for t in members])
        if norm == "std":
            y = (x - x.mean()) / (x.std() + 1e-6) if x.std() > 1e-6 else torch.zeros_like(x)
        else:
            y = x - x.mean()
        ep.update(dict(zip(members, y.tolist())))
    step = norm_by(lambda s: (s["group"], s["state"]), lambda s: s["step_return"])
    out = {}
    for i, s in enumerate(samples):
        out[(s["traj"], s["step"])] = w_e * ep[s["traj"]] + w_s * step[i]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("norm", ["none", "std"])
def test_equals_roll_reference_on_random_trajectories(seed, norm):
    rng = random.Random(seed)
    P, N = 3, 5
    scores = torch.tensor([[float(rng.random() < 0.5) for _ in range(N)] for _ in range(P)])
    turns = []
    for p in range(P):
        row = []
        for n in range(N):
            k = rng.randint(1, 4)
            row.append([(round(rng.uniform(-1, 1), 3), f"s{rng.randint(0, 3)}") for _ in range(k)])
        turns.append(row)
    per_turn, _ = gigpo_turn_advantages(scores, turns, gamma=0.9, norm=norm, step_weight=0.7, episode_weight=1.3)
    ref = roll_reference(scores.tolist(), turns, 0.9, norm, 1.3, 0.7)
    for p in range(P):
        for n in range(N):
            for t, value in enumerate(per_turn[p][n].tolist()):
                assert value == pytest.approx(ref[((p, n), t)], abs=1e-5)


# --- OpenRLHF glue: bookkeeping of turns --------------------------------------------------------------


def test_turn_info_aligns_turns_with_openrlhf_action_mask():
    from rlhf_ext.patches.openrlhf.turn_credit import TURN_ANCHOR_KEY, TURN_INDEX_KEY, TURN_REWARD_KEY, turn_info

    # prompt 0-2, turn 1 tokens 3-4, feedback 5, turn 2 tokens 6-8; OpenRLHF's action_mask is positions 1..
    response = {"observation_tokens": list(range(9)), "action_ranges": [(3, 5), (6, 9)],
                "rlhf_ext_turns": [(0.0, 11), (1.0, 22)]}
    info = turn_info(response, truncate_length=2048)
    assert info[TURN_INDEX_KEY].tolist() == [[0, 0, 1, 1, 0, 2, 2, 2]]
    assert info[TURN_REWARD_KEY].tolist() == [[0.0, 1.0]] and info[TURN_ANCHOR_KEY].tolist() == [[11, 22]]
    assert turn_info({"action_ranges": []}, 10) is None
    with pytest.raises(ValueError, match="recorded 1 step"):
        turn_info({**response, "rlhf_ext_turns": [(0.0, 1)]}, 2048)


def test_grouped_turns_and_assignment_follow_openrlhf_prompt_order():
    from rlhf_ext.patches.openrlhf.turn_credit import assign_turn_advantages, grouped_turns

    # two experiences of two samples each; prompt order 2, 0 | 3, 1 (n = 2: prompts {0, 1} and {2, 3})
    index_a = torch.tensor([[1, 1, 0, 2], [1, 0, 0, 0]])
    index_b = torch.tensor([[1, 2, 0, 0], [1, 1, 2, 3]])
    data = [(index_a, torch.tensor([[0.0, 1.0, 0.0], [5.0, 0.0, 0.0]]), torch.tensor([[7, 8, 0], [7, 0, 0]])),
            (index_b, torch.tensor([[0.0, 2.0, 0.0], [1.0, 1.0, 1.0]]), torch.tensor([[7, 9, 0], [7, 9, 9]]))]
    indices = torch.tensor([2, 0, 3, 1])
    turns = grouped_turns(data, indices, 2)
    assert turns == [[[(5.0, 7)], [(1.0, 7), (1.0, 9), (1.0, 9)]], [[(0.0, 7), (1.0, 8)], [(0.0, 7), (2.0, 9)]]]
    advantages = torch.arange(12, dtype=torch.float32).reshape(2, 2, 3)  # [P, N, K]
    out = assign_turn_advantages(advantages, data, indices, [2, 2])
    # sample 0 of experience a is prompt-order 2 = advantages[1, 0] = [6, 7, 8]
    assert out[0].tolist() == [[6, 6, 0, 7], [0, 0, 0, 0]]
    assert out[1].tolist() == [[9, 10, 0, 0], [3, 3, 4, 5]]


def test_execute_wrapper_records_each_steps_reward_and_anchor():
    from rlhf_ext.patches.openrlhf.turn_credit import TURNS_KEY, _record_step, _turns, anchor_hash

    class Agent:
        async def step(self, states, **kwargs):
            return {"rewards": torch.tensor(0.5), "done": True, **states.get("extra", {})}

    Agent.step = _record_step(Agent.step)

    async def one(extra):
        turns = []
        token = _turns.set(turns)
        try:
            await Agent().step({"observation_text": "ctx", **({"extra": extra} if extra else {})})
        finally:
            _turns.reset(token)
        return turns

    async def both():
        return await asyncio.gather(one(None), one({"anchor_state": ("room", 3)}))

    plain, own = asyncio.run(both())
    assert plain == [(0.5, anchor_hash("ctx"))] and own == [(0.5, anchor_hash(repr(("room", 3))))]
    assert 0 < anchor_hash("ctx") < 2 ** 56 and TURNS_KEY == "rlhf_ext_turns"


# --- other hosts refuse at start-up ----------------------------------------------------------------------


def test_verl_and_mindspeed_refuse_gigpo_at_start_up():
    from rlhf_ext.patches.mindspeed_rl.config import ConfigError, check_estimator
    from rlhf_ext.patches.verl.startup import config_problems

    problems = config_problems({"algorithm": {"adv_estimator": "rlhf_ext_gigpo"}})
    assert any("no turns" in p and "OpenRLHF's multi-turn agent executor" in p for p in problems), problems
    with pytest.raises(ConfigError, match="no multi-turn agent rollouts"):
        check_estimator("gigpo", {})


def check_gigpo_agent_run(metrics_rows, max_turns: int = 2):
    """The assertions for a real run with ``--algo.advantage.estimator gigpo`` and a multi-turn agent of at most
    ``max_turns`` turns (the two-turn math agent): every step's turns reached the estimator (its metrics
    logged: turns per trajectory in [1, max_turns], the N samples of a prompt share at least their first
    turn's anchor, the prompt), and the turn bookkeeping never reached the logged status."""
    assert metrics_rows, "the run logged no step"
    for row in metrics_rows:
        value = {k[len("train/"):] if k.startswith("train/") else k: v for k, v in row.items()}
        assert not any("turn_index" in k or "turn_anchor" in k or "turn_reward" in k for k in value), sorted(row)
        assert 1 <= value["gigpo/turns_mean"] <= max_turns, value
        assert 1 / max_turns - 1e-6 <= value["gigpo/shared_anchor_frac"] <= 1, value
        assert math.isfinite(value["policy_loss"]) and math.isfinite(value["advantage_std"])


def test_turn_metrics_count_shared_anchors():
    from rlhf_ext.patches.openrlhf.turn_credit import SHARED_KEY, TURNS_MEAN_KEY, attach_turn_metrics

    _, turns = worked_example()
    experiences = [SimpleNamespace(action_mask=torch.ones(3, 4), info={}),
                   SimpleNamespace(action_mask=torch.ones(1, 4), info={})]
    attach_turn_metrics(experiences, turns)
    assert experiences[0].info[TURNS_MEAN_KEY].tolist() == [2.5] * 3  # 10 turns over 4 trajectories
    assert experiences[1].info[SHARED_KEY].tolist() == pytest.approx([0.6])  # s0 (4 turns) and s1 (2) of 10

"""The patched RemoteExperienceMaker (real OpenRLHF 0.11.2 class) against rlhf_ext.algorithms.

Built the way OpenRLHF's own tests build it (tests/test_reward_shaping.py): ``__new__`` plus the
attributes compute_advantages_and_returns reads, real ``Experience`` objects.
"""

import copy
from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import dr_grpo, get_advantage, grpo, maxrl, passk, register_advantage, whiten
from rlhf_ext.algorithms.registry import ADVANTAGES


@pytest.fixture(scope="module")
def em():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.trainer.ppo_utils import experience_maker

    yield experience_maker
    deactivate()


@pytest.fixture(scope="module")
def Experience(em):
    from openrlhf.trainer.ppo_utils.experience import Experience

    return Experience


def make_maker(em, estimator, n, kl_coef=0.0, clip_range=None, **advantage):
    maker = em.RemoteExperienceMaker.__new__(em.RemoteExperienceMaker)
    maker.advantage_estimator = estimator
    maker.kl_ctl = SimpleNamespace(value=kl_coef)
    adv = dict(estimator=estimator, gamma=1.0, lambd=1.0, no_std_norm=False)
    adv.update(advantage)
    maker.strategy = SimpleNamespace(
        args=SimpleNamespace(
            rollout=SimpleNamespace(n_samples_per_prompt=n),
            reward=SimpleNamespace(clip_range=clip_range),
            algo=SimpleNamespace(advantage=SimpleNamespace(**adv)),
        )
    )
    return maker


LENGTHS = [3, 5, 1, 4, 2, 5, 5, 3, 4, 1, 2, 3]  # 3 prompts x 4 samples
WIDTH = 6


def make_batch(Experience, rewards, *, scores=None, kl=None, micro=(5, 4, 3), seed=0):
    """Split samples over micro-batches in a shuffled order, as OpenRLHF's DP dispatch does."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(rewards), generator=g).tolist()
    mask = torch.zeros(len(rewards), WIDTH)
    for i, n in enumerate(LENGTHS[: len(rewards)]):
        mask[i, :n] = 1
    kl = torch.zeros(len(rewards), WIDTH) if kl is None else kl
    experiences, start = [], 0
    for size in micro:
        idx = order[start : start + size]
        start += size
        experiences.append(
            Experience(
                index=idx,
                rewards=rewards[idx].clone(),
                scores=None if scores is None else scores[idx].clone(),
                action_mask=mask[idx].clone(),
                kl=kl[idx].clone(),
                values=torch.zeros(len(idx), WIDTH),
                info={},
            )
        )
    return experiences, mask


def gather(experiences, field):
    """Per-sample rows back in sample order."""
    rows = {}
    for e in experiences:
        value = getattr(e, field) if field != "info" else None
        for j, i in enumerate(e.index):
            rows[i] = value[j]
    return torch.stack([rows[i] for i in sorted(rows)])


def gather_info(experiences, key):
    rows = {}
    for e in experiences:
        for j, i in enumerate(e.index):
            rows[i] = e.info[key][j]
    return torch.stack([rows[i] for i in sorted(rows)])


BINARY = torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 0])


@pytest.mark.parametrize(
    "name,options,reference",
    [
        ("grpo", {}, lambda s: grpo(s)),
        ("passk", {"passk_k": 2}, lambda s: passk(s, k=2)),
        ("maxrl", {}, lambda s: maxrl(s)),
    ],
)
def test_group_estimators_match_rlhf_ext_algorithms(em, Experience, name, options, reference):
    experiences, mask = make_batch(Experience, BINARY)
    out = make_maker(em, name, 4, **options).compute_advantages_and_returns(experiences)
    expected = reference(BINARY.view(3, 4)).reshape(-1, 1) * mask  # outcome on every response token
    torch.testing.assert_close(gather(out, "advantages"), expected)
    torch.testing.assert_close(gather(out, "returns"), expected)
    assert all(e.kl is None for e in out)
    torch.testing.assert_close(gather_info(out, "return"), reference(BINARY.view(3, 4)).reshape(-1))


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_family_is_whitened_over_the_batch(em, Experience, name):
    rewards = torch.tensor([0.5, 0.0, 1.0, 1.0, 0.2, 0.0, 0.7, 0.1, 1.0, 0.3, 0.0, 0.9])
    experiences, mask = make_batch(Experience, rewards)
    out = make_maker(em, name, 4).compute_advantages_and_returns(experiences)
    outcome = get_advantage(name)(rewards.view(3, 4)).reshape(-1, 1) * mask
    expected = whiten(outcome, mask.bool())
    torch.testing.assert_close(gather(out, "advantages"), expected)
    adv = gather(out, "advantages")[mask.bool()]
    assert abs(float(adv.mean())) < 1e-6 and abs(float(adv.std(unbiased=False)) - 1) < 1e-4


def test_reinforce_pp_honours_gamma_and_no_std_norm(em, Experience):
    rewards = torch.tensor([1.0, 2.0])
    mask = torch.ones(2, 3)
    exp = Experience(index=[0, 1], rewards=rewards.clone(), action_mask=mask, kl=torch.zeros(2, 3), info={})
    out = make_maker(em, "reinforce_pp", 1, gamma=0.5, no_std_norm=True).compute_advantages_and_returns([exp])[0]
    returns = torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 2.0]])  # r * gamma^(distance to the last token)
    torch.testing.assert_close(out.returns, returns)
    torch.testing.assert_close(out.advantages, returns - returns.mean())


def test_kl_penalty_enters_the_token_rewards(em, Experience):
    torch.manual_seed(3)
    kl = torch.rand(12, WIDTH)
    experiences, mask = make_batch(Experience, BINARY, kl=kl)
    out = make_maker(em, "grpo", 4, kl_coef=0.1).compute_advantages_and_returns(experiences)
    outcome = grpo(BINARY.view(3, 4)).reshape(-1)
    expected = torch.zeros(12, WIDTH)
    for i, n in enumerate(LENGTHS):
        running = 0.0
        for t in reversed(range(n)):  # reward-to-go of (outcome at the last token) - 0.1 * kl_t
            running += -0.1 * float(kl[i, t]) + (float(outcome[i]) if t == n - 1 else 0.0)
            expected[i, t] = running
    torch.testing.assert_close(gather(out, "advantages"), expected)


def test_estimator_options_and_reward_clip(em, Experience):
    experiences, mask = make_batch(Experience, BINARY)
    out = make_maker(em, "grpo", 4, option=["std_scope=none"]).compute_advantages_and_returns(experiences)
    torch.testing.assert_close(gather(out, "advantages"), dr_grpo(BINARY.view(3, 4)).reshape(-1, 1) * mask)

    rewards = torch.tensor([5.0, -3.0, 0.5, 0.0])
    exp = Experience(index=[0, 1, 2, 3], rewards=rewards, action_mask=torch.ones(4, 1), kl=torch.zeros(4, 1), info={})
    out = make_maker(em, "grpo", 4, clip_range=(-1.0, 1.0), option=["std_scope=none"]).compute_advantages_and_returns([exp])
    clipped = torch.tensor([1.0, -1.0, 0.5, 0.0])
    torch.testing.assert_close(out[0].advantages[:, 0], clipped - clipped.mean())


def test_passk_on_scores_when_the_reward_is_shaped(em, Experience):
    scores = BINARY.clone()
    shaped = scores + 0.2  # e.g. a format bonus: no longer 0/1
    experiences, mask = make_batch(Experience, shaped, scores=scores)
    with pytest.raises(ValueError, match="binary"):
        make_maker(em, "passk", 4, passk_k=2).compute_advantages_and_returns(copy.deepcopy(experiences))
    out = make_maker(em, "passk", 4, passk_k=2, input="score").compute_advantages_and_returns(experiences)
    torch.testing.assert_close(gather(out, "advantages"), passk(scores.view(3, 4), k=2).reshape(-1, 1) * mask)


def test_missing_passk_k_is_a_clear_error(em, Experience):
    experiences, _ = make_batch(Experience, BINARY)
    with pytest.raises(ValueError, match="option k is required"):
        make_maker(em, "passk", 4).compute_advantages_and_returns(experiences)


def test_third_party_registration_is_usable(em, Experience):
    @register_advantage("test_plugin_halved")
    def halved(scores):
        return 0.5 * scores

    try:
        experiences, mask = make_batch(Experience, BINARY)
        out = make_maker(em, "test_plugin_halved", 4).compute_advantages_and_returns(experiences)
        torch.testing.assert_close(gather(out, "advantages"), 0.5 * BINARY[:, None] * mask)
    finally:
        ADVANTAGES.unregister("test_plugin_halved")


def test_unknown_estimator_lists_registered_names(em, Experience):
    experiences, _ = make_batch(Experience, BINARY)
    with pytest.raises(KeyError, match="registered: .*grpo"):
        make_maker(em, "no_such_estimator", 4).compute_advantages_and_returns(experiences)


def test_zero_variance_group_fraction(em, Experience):
    experiences, _ = make_batch(Experience, BINARY)  # groups: mixed, all-zero, mixed
    out = make_maker(em, "grpo", 4).compute_advantages_and_returns(experiences)
    flags = gather_info(out, "zero_variance_group_frac")
    assert flags.tolist() == [0.0] * 4 + [1.0] * 4 + [0.0] * 4
    assert float(flags.mean()) == pytest.approx(1 / 3)  # what OpenRLHF's sample-weighted logging reports


@pytest.mark.parametrize(
    "name", ["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce"]
)
@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
def test_openrlhf_estimators_are_bit_identical(em, Experience, name, kl_coef):
    from rlhf_ext.patches.openrlhf import compat

    original = compat.original(em.RemoteExperienceMaker, "compute_advantages_and_returns")
    torch.manual_seed(7)
    rewards = torch.randn(12)
    experiences, _ = make_batch(Experience, rewards, kl=torch.rand(12, WIDTH) * 0.1)
    for e in experiences:
        e.values = torch.randn_like(e.action_mask)
    ours = make_maker(em, name, 4, kl_coef=kl_coef, clip_range=(-10, 10))
    theirs = make_maker(em, name, 4, kl_coef=kl_coef, clip_range=(-10, 10))
    out = ours.compute_advantages_and_returns(copy.deepcopy(experiences))
    ref = original(theirs, copy.deepcopy(experiences))
    for a, b in zip(out, ref):
        assert torch.equal(a.advantages, b.advantages)
        assert torch.equal(a.returns, b.returns)
        assert torch.equal(a.rewards, b.rewards)
        assert set(a.info) - set(b.info) == {"zero_variance_group_frac", "advantage_std"}


@pytest.mark.parametrize("name", ["grpo", "maxrl"])  # registered estimators (OpenRLHF's own have no input checks)
def test_nan_reward_goes_to_the_guard_not_a_value_error(em, Experience, name):
    """Guard on: a NaN reward gives NaN advantages for the actor's guard and a ``nonfinite_input`` event;
    guard off: the input check's ValueError, as before."""
    from rlhf_ext.patches.openrlhf import run_record

    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0] * 3)
    rewards[5] = float("nan")
    maker = make_maker(em, name, 4)
    with pytest.raises(ValueError, match=r"contains 1 NaN and 0 Inf"):
        maker.compute_advantages_and_returns(make_batch(Experience, rewards)[0])
    maker.strategy.args.rlhf_ext = SimpleNamespace(guard="stop")
    run_record._take_events()
    experiences = maker.compute_advantages_and_returns(make_batch(Experience, rewards)[0])
    # exactly sample 5's advantages are non-finite (maxrl alone would zero its group: the guard must see it)
    bad = {i for e in experiences for i, row, m in zip(e.index, e.advantages, e.action_mask)
           if not torch.isfinite(row[m.bool()]).all()}
    assert bad == {5} if name == "maxrl" else 5 in bad
    (event,) = run_record._take_events()
    assert event["event"] == "nonfinite_input" and event["where"] == "advantages" and event["estimator"] == name
    assert event["check"].endswith("scores") and event["nan_count"] == 1 and event["inf_count"] == 0
    assert event["first_index"] == [1, 1]  # sample 5 is prompt 1's second sample


def test_new_estimators_through_the_patched_path(em, Experience):
    """gpg / opo / passk_best in OpenRLHF's pipeline equal the functions on the grouped rewards;
    opo receives each response's length (its action-mask sum), in prompt order."""
    from rlhf_ext.algorithms import gpg, opo, passk_best

    grouped = BINARY.view(3, 4)
    lengths = torch.tensor(LENGTHS, dtype=torch.float32).view(3, 4)
    for name, reference in (("gpg", gpg(grouped)), ("opo", opo(grouped, lengths=lengths)),
                            ("passk_best", passk_best(grouped))):
        experiences, mask = make_batch(Experience, BINARY)
        out = make_maker(em, name, 4).compute_advantages_and_returns(experiences)
        torch.testing.assert_close(gather(out, "advantages"), reference.reshape(-1, 1) * mask)
    # OPO by hand, group 1: rewards 1, 0, 0, 1, lengths 3, 5, 1, 4 -> baseline 7 / 13
    b = 7 / 13
    torch.testing.assert_close(opo(grouped, lengths=lengths)[0], torch.tensor([1 - b, -b, -b, 1 - b]))


def test_gdpo_reads_the_reward_components_from_extra_logs(em, Experience):
    from rlhf_ext.algorithms import gdpo

    fmt = torch.tensor([1.0, 1, 0, 1, 0, 1, 0, 0, 1, 1, 1, 1])
    experiences, mask = make_batch(Experience, BINARY + 0.2 * fmt)
    for e in experiences:  # what rlhf_ext's reward reports per sample (extra_logs -> info)
        e.info["reward/accuracy"] = BINARY[e.index].clone()
        e.info["reward/format"] = fmt[e.index].clone()
    out = make_maker(em, "gdpo", 4).compute_advantages_and_returns(experiences)
    want = gdpo(BINARY.view(3, 4), components={"accuracy": BINARY.view(3, 4), "format": fmt.view(3, 4)})
    torch.testing.assert_close(gather(out, "advantages"), want.reshape(-1, 1) * mask)
    # the third group's format is all 1: only accuracy contributes there
    torch.testing.assert_close(want[2], grpo(BINARY.view(3, 4))[2])

    experiences, _ = make_batch(Experience, BINARY)
    with pytest.raises(ValueError, match="rollouts carry none.*--reward.functions"):
        make_maker(em, "gdpo", 4).compute_advantages_and_returns(experiences)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "reinforce_baseline", "rloo"])  # rlhf_ext's and OpenRLHF's
def test_advantage_std_over_the_batchs_response_tokens(em, Experience, name):
    experiences, mask = make_batch(Experience, BINARY)
    out = make_maker(em, name, 4).compute_advantages_and_returns(experiences)
    adv = gather(out, "advantages")
    tokens = adv[mask.bool()].double()
    expected = ((tokens - tokens.mean()) ** 2).mean().sqrt()  # population std over response tokens
    values = gather_info(out, "advantage_std")
    assert values.double() == pytest.approx(torch.full((12,), float(expected)).double(), rel=1e-6)
    assert float(expected) > 0
    # a batch in which every group is all-equal carries no signal: the std is 0
    flat, _ = make_batch(Experience, torch.tensor([1.0] * 4 + [0.0] * 8))
    out = make_maker(em, name, 4).compute_advantages_and_returns(flat)
    assert gather_info(out, "advantage_std").abs().max() == pytest.approx(0.0, abs=1e-6)

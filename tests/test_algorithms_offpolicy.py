"""rft advantage, pg / noclip losses (hand-computed, gradient identity with autograd), and the
zero-advantage update counter, alone and inside OpenRLHF's real training_step."""

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import (
    UpdateCounter,
    available_advantages,
    available_policy_losses,
    get_advantage,
    get_policy_loss,
    has_signal,
    noclip,
    pg,
    ppo,
    rft,
    zero_advantage_rows,
)

T = torch.tensor


def test_registered():
    assert "rft" in available_advantages() and get_advantage("rft") is rft
    assert {"pg", "noclip"} <= set(available_policy_losses())
    assert get_policy_loss("pg") is pg and get_policy_loss("noclip") is noclip


def test_rft_binary_and_threshold():
    scores = T([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    assert torch.equal(rft(scores), T([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))  # no baseline: no centring
    shaped = T([[1.2, 0.2, 1.0, 0.5, -0.3]])  # correct+format, format only, correct, correct+truncated, truncated
    assert torch.equal(rft(shaped), T([[1.0, 0.0, 1.0, 0.0, 0.0]]))
    assert torch.equal(rft(T([[0.4, 0.6]]), threshold=0.5), T([[0.0, 1.0]]))
    assert torch.equal(rft(T([[1.0]])), T([[1.0]]))  # one sample per prompt is fine


def test_rft_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        rft(T([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="threshold"):
        rft(T([[1.0]]), threshold=float("nan"))
    with pytest.raises(ValueError, match="shape"):
        rft(T([1.0, 0.0]))


def test_pg_hand_computed():
    lp = T([[-0.5, -1.0, -2.0], [-0.1, -0.2, 5.0]])
    old = T([[-0.5, -0.5, -1.0], [-0.1, -0.3, 0.0]])
    adv = T([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    loss, m = pg(lp, old, adv, mask)
    # -A * log pi on the mask, 0 on padding
    torch.testing.assert_close(loss, T([[1.0, 2.0, 4.0], [-0.1, -0.2, 0.0]]))
    # metrics: log ratios on the mask 0, -0.5, -1, 0, 0.1
    torch.testing.assert_close(m["ppo_kl"], T((0 + 0.5 + 1 + 0 - 0.1) / 5))
    ratios = torch.exp(T([0.0, -0.5, -1.0, 0.0, 0.1]))
    torch.testing.assert_close(m["ratio_mean"], ratios.mean())
    torch.testing.assert_close(m["ratio_max"], ratios.max())


def test_noclip_hand_computed_no_clipping():
    ratios = T([[0.1, 1.0, 5.0]])
    lp = torch.log(ratios)
    old = torch.zeros_like(lp)
    mask = torch.ones_like(lp)
    loss, _ = noclip(lp, old, T([[1.0, 1.0, 1.0]]), mask)
    torch.testing.assert_close(loss, -ratios)  # 5.0 is not clipped to 1.2 as PPO would
    loss_ppo, _ = ppo(lp, old, T([[1.0, 1.0, 1.0]]), mask, eps_low=0.2)
    torch.testing.assert_close(loss_ppo, T([[-0.1, -1.0, -1.2]]))
    loss, _ = noclip(lp, old, T([[-2.0, -2.0, -2.0]]), mask)
    torch.testing.assert_close(loss, 2 * ratios)
    # the overflow guard: log ratio 200 becomes 20, finite
    loss, _ = noclip(T([[200.0]]), T([[0.0]]), T([[1.0]]), T([[1]]))
    assert torch.isfinite(loss).all() and float(loss) == pytest.approx(-float(torch.exp(T(20.0))))


def _logits_case(seed=0, B=3, T_=5, V=7):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T_, V, generator=g)
    tokens = torch.randint(0, V, (B, T_), generator=g)
    adv = torch.randn(B, T_, generator=g)
    mask = torch.ones(B, T_)
    mask[1, 3:] = 0
    return logits, tokens, adv, mask


def _grad(loss_name, logits0, tokens, adv, mask, old_logits=None):
    logits = logits0.clone().requires_grad_(True)
    lp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    src = logits0 if old_logits is None else old_logits
    old = torch.log_softmax(src, -1).gather(-1, tokens[..., None])[..., 0]
    loss, _ = get_policy_loss(loss_name)(lp, old.detach(), adv, mask)
    loss.sum().backward()
    return logits.grad


def test_gradient_identity_on_policy():
    """On-policy pg, noclip and (unclipped region of) ppo have the same gradient: -A grad log pi."""
    logits, tokens, adv, mask = _logits_case()
    g_pg = _grad("pg", logits, tokens, adv, mask)
    g_nc = _grad("noclip", logits, tokens, adv, mask)
    g_ppo = _grad("ppo", logits, tokens, adv, mask)
    torch.testing.assert_close(g_pg, g_nc)
    torch.testing.assert_close(g_pg, g_ppo)
    assert g_pg.abs().sum() > 0
    # and the padding position contributes nothing
    assert torch.equal(g_pg[1, 3:], torch.zeros_like(g_pg[1, 3:]))


def test_gradient_differs_off_policy_by_the_ratio():
    logits, tokens, adv, mask = _logits_case(seed=1)
    old_logits = logits + 0.5 * torch.randn_like(logits)
    g_pg = _grad("pg", logits, tokens, adv, mask, old_logits)
    g_nc = _grad("noclip", logits, tokens, adv, mask, old_logits)
    assert not torch.allclose(g_pg, g_nc)
    # noclip's gradient is pg's with each token's term weighted by rho = pi / pi_old
    lp = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
    old = torch.log_softmax(old_logits, -1).gather(-1, tokens[..., None])[..., 0]
    rho = torch.exp(lp - old)
    g_weighted = _grad("pg", logits, tokens, adv * rho, mask, old_logits)
    torch.testing.assert_close(g_nc, g_weighted)


def test_rft_with_pg_is_likelihood_of_accepted_samples():
    logits, tokens, _, mask = _logits_case(seed=2)
    accepted = rft(T([[1.0, 0.0, 1.0]]))[0]  # samples 0 and 2 accepted
    adv = accepted[:, None].expand(-1, tokens.shape[1]).contiguous()
    g = _grad("pg", logits, tokens, adv, mask)
    # the same as -sum log pi over the accepted samples' tokens
    x = logits.clone().requires_grad_(True)
    lp = torch.log_softmax(x, -1).gather(-1, tokens[..., None])[..., 0]
    (-(lp[0].sum() + lp[2].sum())).backward()
    torch.testing.assert_close(g, x.grad)
    assert torch.equal(g[1], torch.zeros_like(g[1]))


def test_losses_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        pg(T([[float("nan")]]), T([[0.0]]), T([[1.0]]), T([[1]]))
    with pytest.raises(ValueError, match="shape mismatch"):
        noclip(T([[0.0, 0.0]]), T([[0.0]]), T([[1.0]]), T([[1]]))


def test_zero_advantage_rows_and_counter():
    mask = T([[1, 1, 0], [1, 1, 1]])
    adv = T([[0.0, 0.0, 9.0], [0.0, 0.5, 0.0]])  # row 0: only padding is non-zero
    assert zero_advantage_rows(adv, mask).tolist() == [True, False]
    assert has_signal(adv, mask) and not has_signal(torch.zeros(2, 3), mask)
    c = UpdateCounter()
    # step 1: two micro-batches, one with signal -> applied
    c.add_micro_batch(torch.zeros(2, 3), mask)
    c.add_micro_batch(adv, mask)
    assert c.end_update() is True
    # step 2: all zero -> attempted, not applied
    c.add_micro_batch(torch.zeros(2, 3), mask)
    assert c.end_update() is False
    # step 3: locally zero, but another rank had signal (the max over ranks decides)
    c.add_micro_batch(torch.zeros(2, 3), mask)
    assert c.end_update(signal=True) is True
    assert c.metrics() == {
        "rlhf_ext/updates_attempted": 3.0,
        "rlhf_ext/updates_applied": 2.0,
        "rlhf_ext/updates_zero_advantage": 1.0,
    }


# ---- inside OpenRLHF's actor -------------------------------------------------------------------


@pytest.fixture(scope="module")
def actor_module():
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    from openrlhf.trainer.ray import ppo_actor

    yield ppo_actor
    deactivate()


class TinyActor(torch.nn.Module):
    def __init__(self, old):
        super().__init__()
        self.old = old
        self.theta = torch.nn.Parameter(torch.zeros_like(old))

    def forward(self, sequences, action_mask, attention_mask=None, return_output=False, **kwargs):
        return self.old + self.theta, SimpleNamespace(aux_loss=None, entropy=None)


@pytest.mark.parametrize("loss_type", ["pg", "noclip"])
def test_openrlhf_training_step_counts_zero_advantage_updates(actor_module, loss_type):
    """The real (patched) training_step and ppo_train wrapper, gas = 2: one of two updates has no signal."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    from rlhf_ext.patches.openrlhf.policy_loss import configure_from_args
    from rlhf_ext.patches.openrlhf.updates import make_ppo_train

    B, T_ = 2, 4
    mask = torch.ones(B, T_, dtype=torch.bool)
    old = -torch.rand(B, T_)
    args = SimpleNamespace(
        actor=SimpleNamespace(entropy_coef=None, aux_loss_coef=0.0, loss_agg_mode="token-mean",
                              policy_loss_type=loss_type),
        algo=SimpleNamespace(kl=SimpleNamespace(use_loss=False)),
        train=SimpleNamespace(dynamic_batch_enable=False),
    )  # fmt: skip
    trainer = actor_module.ActorPPOTrainer.__new__(actor_module.ActorPPOTrainer)
    trainer.args = args
    trainer.actor = TinyActor(old)
    trainer.actor_loss_fn = actor_module.PolicyLoss(policy_loss_type=loss_type)
    configure_from_args(trainer.actor_loss_fn, args)
    trainer.actor_optim = torch.optim.SGD(trainer.actor.parameters(), lr=0.1)
    trainer.strategy = SimpleNamespace(
        ring_attn_group=None, accumulated_gradient=2,
        backward=lambda loss, model, opt: loss.backward(),
        optimizer_step=lambda opt, model, sched, name=None: None,
        get_grad_norm=lambda model: 0.0,
    )  # fmt: skip
    trainer.actor_scheduler = SimpleNamespace(get_last_lr=lambda: [0.1])
    trainer.ema_model = None
    trainer.aux_loss = False
    advs = [torch.zeros(B, T_), torch.ones(B, T_), torch.zeros(B, T_), torch.zeros(B, T_)]

    def fake_loop(self, kl_ctl):  # stands in for ppo_train's data loop: 4 micro-batches, gas 2
        for step, adv in enumerate(advs):
            exp = Experience(
                sequences=torch.zeros(B, T_, dtype=torch.long), attention_mask=torch.ones(B, T_),
                action_mask=mask, action_log_probs=old, advantages=adv, info={},
            )  # fmt: skip
            info = {"dp_size": 1, "batch_num_tokens": mask.sum().float(), "global_batch_size": torch.tensor(float(B))}
            self.training_step(exp, 0.0, step, info)
        return {"policy_loss": 0.0}

    ppo_train = make_ppo_train(fake_loop)
    status = ppo_train(trainer, 0.0)
    assert status["rlhf_ext/updates_attempted"] == 2.0
    assert status["rlhf_ext/updates_applied"] == 1.0
    assert status["rlhf_ext/updates_zero_advantage"] == 1.0
    status = ppo_train(trainer, 0.0)  # per call, plus running totals
    assert status["rlhf_ext/updates_attempted"] == 2.0
    assert status["rlhf_ext/updates_attempted_total"] == 4.0
    assert status["rlhf_ext/updates_applied_total"] == 2.0

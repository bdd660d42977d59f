"""SimPO and its SFT term (rlhf_ext.algorithms.preference): hand-computed values and invariants."""

from __future__ import annotations

import math

import pytest
import torch

from rlhf_ext.algorithms import nll_loss, simpo_loss, simpo_objective

LOG1P_EXP_M1 = math.log(1 + math.exp(-1))  # 0.31326168751822286


def test_simpo_hand_computed_value_and_rewards():
    # z = beta*c - beta*r - gamma = 2*(-1) - 2*(-2) - 1 = 1 -> loss = log(1 + e^-1)
    losses, m = simpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), beta=2.0, gamma=1.0)
    assert losses.item() == pytest.approx(0.3132616875, abs=1e-7)
    assert losses.item() == pytest.approx(LOG1P_EXP_M1, abs=1e-7)
    assert m["chosen_reward"].tolist() == [-2.0] and m["rejected_reward"].tolist() == [-4.0]
    assert m["margin"].tolist() == [2.0] and m["accuracy"].item() == 1.0


def test_simpo_equal_responses_without_margin_is_log2():
    losses, m = simpo_loss([-1.5, -0.2], [-1.5, -0.2], beta=2.5, gamma=0.0)
    assert losses.tolist() == pytest.approx([math.log(2)] * 2, abs=1e-7)
    assert m["accuracy"].item() == 0.0  # ties are not wins


def test_simpo_label_smoothing_adds_eps_times_z():
    # (1-e)*log(1+e^-z) + e*log(1+e^z) = log(1+e^-z) + e*z; z = 1, e = 0.1
    losses, _ = simpo_loss([-1.0], [-2.0], beta=2.0, gamma=1.0, label_smoothing=0.1)
    assert losses.item() == pytest.approx(LOG1P_EXP_M1 + 0.1, abs=1e-7)


def test_simpo_gradient_is_minus_beta_sigmoid_minus_z():
    c = torch.tensor([-1.0], requires_grad=True)
    r = torch.tensor([-2.0], requires_grad=True)
    losses, _ = simpo_loss(c, r, beta=2.0, gamma=1.0)
    losses.sum().backward()
    sig = 1 / (1 + math.e)  # sigmoid(-1)
    assert c.grad.item() == pytest.approx(-2 * sig, abs=1e-7)  # -0.5378828
    assert r.grad.item() == pytest.approx(2 * sig, abs=1e-7)


def test_simpo_larger_gamma_means_larger_loss_and_loss_falls_with_margin():
    base, _ = simpo_loss([-1.0], [-2.0], beta=2.0, gamma=0.5)
    more, _ = simpo_loss([-1.0], [-2.0], beta=2.0, gamma=1.5)
    wider, _ = simpo_loss([-0.5], [-2.0], beta=2.0, gamma=0.5)
    assert more.item() > base.item() > wider.item() > 0


def test_objective_adds_the_nll_term():
    # beta 1, gamma 0: z = [1, -1] -> losses [log(1+e^-1), log(1+e)] mean = log(1+e^-1) + 0.5;
    # NLL = -mean([-1, -3]) = 2; total = mean + 0.5 * 2
    loss, m = simpo_objective([-1.0, -3.0], [-2.0, -2.0], beta=1.0, gamma=0.0, nll_coef=0.5)
    assert m["simpo_loss"].item() == pytest.approx(LOG1P_EXP_M1 + 0.5, abs=1e-6)
    assert m["nll_loss"].item() == pytest.approx(2.0)
    assert loss.item() == pytest.approx(LOG1P_EXP_M1 + 0.5 + 1.0, abs=1e-6)
    assert m["accuracy"].item() == 0.5
    assert nll_loss([-1.0, -3.0]).item() == pytest.approx(2.0)


@pytest.mark.parametrize("kwargs, chosen, rejected, message", [
    ({"beta": 0.0}, [-1.0], [-2.0], "beta"),
    ({"gamma": float("nan")}, [-1.0], [-2.0], "gamma"),
    ({"label_smoothing": 0.5}, [-1.0], [-2.0], "label_smoothing"),
    ({}, [-1.0, -2.0], [-2.0], "differ in shape"),
    ({}, [], [], "no preference pairs"),
    ({}, [[-1.0]], [[-2.0]], "1-D"),
    ({}, [float("nan")], [-2.0], "NaN"),
])  # fmt: skip
def test_simpo_rejects_bad_input(kwargs, chosen, rejected, message):
    with pytest.raises(ValueError, match=message):
        simpo_loss(chosen, rejected, **kwargs)


def test_objective_rejects_negative_nll_coef():
    with pytest.raises(ValueError, match="nll_coef"):
        simpo_objective([-1.0], [-2.0], nll_coef=-1)

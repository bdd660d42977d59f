"""Preference losses on sequence log-likelihoods: SimPO, and the SFT (NLL) term it is paired with.

SimPO (Meng, Xia and Chen 2024, "SimPO: Simple Preference Optimization with a Reference-Free
Reward", arXiv 2405.14734, Eq. 6) scores a response by its *length-normalised* log-likelihood
under the policy and asks the chosen response to beat the rejected one by a target margin
``gamma``::

    r(x, y)   = beta / |y| * log pi(y | x)                 (mean token log-prob, times beta)
    L_SimPO   = -log sigmoid( r(x, y_w) - r(x, y_l) - gamma )

No reference model is involved. With label smoothing ``eps`` (the conservative form of Mitchell's
cDPO note, as the SimPO reference implementation offers it) the per-pair loss is
``(1 - eps) * -log sigmoid(z) + eps * -log sigmoid(-z)``.

Plain SimPO is known to drift into degenerate text on long reasoning traces, because nothing
anchors the absolute likelihood of the chosen answer; the usual fix (e.g. the "CPO-SimPO" recipe,
Llama 3.1's NLL-regularised DPO) adds the SFT loss on the chosen response,
``nll_coef * -mean_token_log_prob(y_w)``, which :func:`simpo_objective` includes.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.nn.functional as F

from .checks import as_float_tensor, check_finite


def _pair(chosen, rejected) -> Tuple[torch.Tensor, torch.Tensor]:
    c = as_float_tensor(chosen, "chosen_logps")
    r = as_float_tensor(rejected, "rejected_logps")
    if c.dim() != 1 or r.dim() != 1:
        raise ValueError(f"chosen/rejected log-probs must be 1-D (one value per pair), got shapes "
                         f"{tuple(c.shape)} and {tuple(r.shape)}")
    if c.shape != r.shape:
        raise ValueError(f"chosen and rejected log-probs differ in shape: {tuple(c.shape)} vs {tuple(r.shape)}")
    if c.numel() == 0:
        raise ValueError("no preference pairs (empty chosen/rejected log-probs)")
    check_finite(c, "chosen_logps")
    check_finite(r, "rejected_logps")
    return c, r


def simpo_loss(chosen_avg_logps, rejected_avg_logps, *, beta: float = 2.0, gamma: float = 1.0,
               label_smoothing: float = 0.0) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Per-pair SimPO loss from the mean token log-prob of each chosen and rejected response.

    Returns ``(losses, metrics)``: ``losses`` has one value per pair (take the mean for the batch
    loss); ``metrics`` holds detached ``chosen_reward`` / ``rejected_reward`` (beta x mean
    log-prob, per pair), ``margin`` (their difference, per pair) and ``accuracy`` (fraction of
    pairs whose chosen reward is higher).

    Hand-checked: chosen -1, rejected -2, beta 2, gamma 1: z = 2*(-1) - 2*(-2) - 1 = 1,
    loss = log(1 + e^-1) = 0.3133.
    """
    if not (isinstance(beta, (int, float)) and beta > 0 and beta != float("inf")):
        raise ValueError(f"SimPO beta must be a positive finite number, got {beta!r}")
    if not (isinstance(gamma, (int, float)) and abs(gamma) != float("inf") and gamma == gamma):
        raise ValueError(f"SimPO gamma must be a finite number, got {gamma!r}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    c, r = _pair(chosen_avg_logps, rejected_avg_logps)
    chosen_reward = beta * c
    rejected_reward = beta * r
    z = chosen_reward - rejected_reward - gamma
    losses = -F.logsigmoid(z) * (1 - label_smoothing) - F.logsigmoid(-z) * label_smoothing
    metrics = {
        "chosen_reward": chosen_reward.detach(),
        "rejected_reward": rejected_reward.detach(),
        "margin": (chosen_reward - rejected_reward).detach(),
        "accuracy": (chosen_reward > rejected_reward).float().mean().detach(),
    }
    return losses, metrics


def nll_loss(chosen_avg_logps) -> torch.Tensor:
    """The SFT term on the chosen responses: mean over pairs of ``-mean token log-prob``."""
    c = as_float_tensor(chosen_avg_logps, "chosen_logps")
    if c.dim() != 1 or c.numel() == 0:
        raise ValueError(f"chosen log-probs must be a non-empty 1-D tensor, got shape {tuple(c.shape)}")
    check_finite(c, "chosen_logps")
    return -c.mean()


def simpo_objective(chosen_avg_logps, rejected_avg_logps, *, beta: float = 2.0, gamma: float = 1.0,
                    nll_coef: float = 0.0,
                    label_smoothing: float = 0.0) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Batch loss ``mean(SimPO) + nll_coef * NLL(chosen)``, with the parts in ``metrics``
    (``simpo_loss``, ``nll_loss`` and everything :func:`simpo_loss` reports)."""
    if not nll_coef >= 0:
        raise ValueError(f"nll_coef must be >= 0, got {nll_coef!r}")
    losses, metrics = simpo_loss(chosen_avg_logps, rejected_avg_logps, beta=beta, gamma=gamma,
                                 label_smoothing=label_smoothing)
    pref = losses.mean()
    nll = nll_loss(chosen_avg_logps)
    metrics = {**metrics, "simpo_loss": pref.detach(), "nll_loss": nll.detach()}
    return pref + nll_coef * nll, metrics


__all__ = ["simpo_loss", "nll_loss", "simpo_objective"]

"""``compute_kl_penalty`` with ``k1``/``k2``/``k3`` and a configurable clamp (seam: ``utils.compute``).

MindSpeed-RL's estimators are ``kl`` (= k1), ``abs``, ``mse`` (= k2) and ``low_var_kl`` (= k3 with
the log ratio clamped to +-20 and the result to a hard-coded [-10, 10]). The replacement:

* a plain name of MindSpeed-RL's without ``rl_config.kl_clip``: the original, bit for bit;
* ``k3+``: k3's value with k2's gradient (verl's ``k3+``, unbiased KL-loss gradient; the value
  clamp leaves that gradient alone), see :func:`rlhf_ext.algorithms.k3_plus`;
* ``k1``/``k2``/``k3`` (Schulman 2020, joschu.net/blog/kl-approx.html) through
  :func:`rlhf_ext.algorithms.kl_estimate` with the log ratio clamped to +-20 (as MindSpeed-RL does
  before ``exp``) and the value clamped to ``kl_clip`` (default [-10, 10]; ``none``: no clamp);
* MindSpeed-RL's names with ``kl_clip``: ``kl``/``mse``/``low_var_kl`` are k1/k2/k3 with that
  clamp, ``abs`` is ``|k1|`` clamped.

Patched where it is looked up: ``utils.compute`` and the modules that import it by name
(``grpo_actor_loss_func``, ``trainer.utils.compute_utils``).
"""

from __future__ import annotations

import functools
import threading

import torch

from .config import DEFAULT_KL_CLIP, MINDSPEED_KL_PENALTIES, kl_clip_of, settings_of

_ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "k1": "k1", "k2": "k2", "k3": "k3", "k3+": "k3+"}
LOG_RATIO_CLIP = 20.0

# Which values the latest call in this thread clamped, read by the loss for its metrics (the seam
# has no response mask; the loss has).
_last = threading.local()


def last_clipped():
    return getattr(_last, "clipped", None)


def rlhf_ext_kl(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, name: str, clip) -> torch.Tensor:
    from rlhf_ext.algorithms import kl_estimate

    bounds = None if clip == "none" else (DEFAULT_KL_CLIP if clip is None else clip)
    if name == "abs":
        value = (log_prob - ref_log_prob).abs()
    else:
        value, _ = kl_estimate(log_prob, ref_log_prob, _ALIASES[name], clip=None, log_ratio_clip=LOG_RATIO_CLIP)
    if name == "k3+":  # the clamps bound the value; the straight-through k2 gradient stays (as verl)
        clamped, _ = kl_estimate(log_prob, ref_log_prob, "k3+", clip=bounds, log_ratio_clip=LOG_RATIO_CLIP)
    elif bounds is None:
        clamped = value
    else:
        clamped = value.clamp(bounds[0], bounds[1])
    _last.clipped = (clamped.detach() != value.detach())
    return clamped


def bias_corrected_kl(log_prob, ref_log_prob, old_log_prob, kl_penalty) -> torch.Tensor:
    """``kl_penalty: k3_bias_corrected`` in the GRPO actor loss: ``(pi / pi_old) k3`` (DeepSeek-V3.2,
    arXiv 2512.02556; TRL 1.16's ``use_bias_correction_kl``), k3 on the log ratio bounded to +-20 and
    the value clamped to ``kl_clip`` (default [-10, 10]) like the other estimators here."""
    from rlhf_ext.algorithms import k3_bias_corrected

    clip = kl_clip_of(settings_of(kl_penalty))
    bounds = None if clip == "none" else (DEFAULT_KL_CLIP if clip is None else clip)
    bounded_ref = log_prob - (log_prob - ref_log_prob).clamp(-LOG_RATIO_CLIP, LOG_RATIO_CLIP)
    value = k3_bias_corrected(log_prob, bounded_ref, old_log_prob)
    clamped = value if bounds is None else value.clamp(bounds[0], bounds[1])
    _last.clipped = (clamped.detach() != value.detach())
    return clamped


def make_compute_kl_penalty(original, module):
    @functools.wraps(original)
    def compute_kl_penalty(logprob, ref_logprob, kl_penalty="low_var_kl"):
        name = str(kl_penalty)
        clip = kl_clip_of(settings_of(kl_penalty))
        if name in MINDSPEED_KL_PENALTIES and clip is None:
            _last.clipped = None
            return original(logprob, ref_logprob, name)
        if name not in _ALIASES and name != "abs":
            return original(logprob, ref_logprob, name)  # MindSpeed-RL's own error for unknown names
        return rlhf_ext_kl(logprob, ref_logprob, name, clip)

    return compute_kl_penalty

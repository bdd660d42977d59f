"""Token masks on the policy loss inside OpenRLHF's actor: the three knobs of issue 22.

* ``--rlhf_ext.top_entropy_quantile Q``: only the top ``Q`` fraction of response tokens by entropy
  carries gradient (arXiv 2506.01939; TRL's ``top_entropy_quantile``). OpenRLHF computes token
  entropy in ``ActorPPOTrainer.training_step`` only when ``--actor.entropy_coef`` is set
  (``0`` computes it without an entropy loss), so the flag needs it; the entropy is read off the
  actor's output by a forward hook. The quantile is taken over the micro-batch's tokens.
* ``--rlhf_ext.mask_truncated_completions``: responses cut at the generation budget carry no
  policy gradient (DAPO's overlong filtering, arXiv 2503.14476; TRL's
  ``mask_truncated_completions``), from OpenRLHF's per-sample ``experience.truncated``.
* ``--rlhf_ext.off_policy_mask_threshold DELTA``: DeepSeek-V3.2's off-policy sequence mask
  (arXiv 2512.02556): a sequence with negative advantage (its masked mean advantage, as
  OpenRLHF's advantages are per token) whose mean KL from the sampling policy exceeds ``DELTA``
  carries no gradient. The sampling policy is vLLM's log-probs when OpenRLHF has them
  (``experience.rollout_log_probs``), else the old policy's.

How: :class:`rlhf_ext.patches.openrlhf.policy_loss` multiplies its per-token policy loss by the
mask (as TRL does): the registered losses directly; OpenRLHF's own ``ppo`` / ``gspo`` by zeroing
the advantages of the masked tokens, which sets exactly those tokens' loss and gradient to 0 (both
losses are ``A`` times a factor per token). The aggregation's token and sequence counts are those
of the full action mask, so the normaliser does not change with the mask (TRL's convention for
the entropy and off-policy masks; TRL's truncation mask also drops the tokens from the count).
The policy loss only: OpenRLHF's KL and entropy loss terms keep the full mask.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Optional

from . import staleness
from .config import setting

if TYPE_CHECKING:  # the CLI side of this module runs at start-up in every process: no torch there
    import torch

ENTROPY_FLAG = "--rlhf_ext.top_entropy_quantile"
TRUNCATED_FLAG = "--rlhf_ext.mask_truncated_completions"
OFF_POLICY_FLAG = "--rlhf_ext.off_policy_mask_threshold"


def add_arguments(group) -> None:
    group.add_argument(
        ENTROPY_FLAG, type=float, default=None, metavar="Q",
        help="only the top Q fraction (0 < Q <= 1) of response tokens by entropy carries policy gradient "
        "(arXiv 2506.01939, TRL's top_entropy_quantile; 0.2 in the paper); needs --actor.entropy_coef (0 is fine)",
    )  # fmt: skip
    group.add_argument(
        TRUNCATED_FLAG, action="store_true", default=False,
        help="truncated responses (cut at the generation budget) carry no policy gradient (DAPO's overlong "
        "filtering, TRL's mask_truncated_completions)",
    )  # fmt: skip
    group.add_argument(
        OFF_POLICY_FLAG, type=float, default=None, metavar="DELTA",
        help="DeepSeek-V3.2's off-policy sequence mask: negative-advantage sequences whose mean KL from the "
        "sampling policy exceeds DELTA carry no policy gradient (TRL's off_policy_mask_threshold)",
    )  # fmt: skip


def finalize(namespace) -> None:
    """Validate the three flags against the rest of the command line (``ValueError`` naming the flag)."""
    q = getattr(namespace, "rlhf_ext.top_entropy_quantile", None)
    if q is not None:
        if not (0 < q <= 1):
            raise ValueError(f"{ENTROPY_FLAG} must be in (0, 1], got {q}")
        if getattr(namespace, "actor.entropy_coef", None) is None:
            raise ValueError(
                f"{ENTROPY_FLAG} needs the token entropy, which OpenRLHF's actor computes only with "
                "--actor.entropy_coef set: add --actor.entropy_coef 0 (entropy without an entropy loss)"
            )
    delta = getattr(namespace, "rlhf_ext.off_policy_mask_threshold", None)
    if delta is not None and not (delta >= 0 and math.isfinite(delta)):
        raise ValueError(f"{OFF_POLICY_FLAG} must be a finite number >= 0, got {delta}")


class _Pending:
    """What the loss of one micro-batch needs besides its arguments."""

    def __init__(self, quantile, truncated, threshold):
        self.quantile, self.threshold = quantile, threshold
        self.truncated = truncated
        self.entropy: Optional["torch.Tensor"] = None


def _settings(args):
    return (setting(args, "rlhf_ext.top_entropy_quantile"),
            bool(setting(args, "rlhf_ext.mask_truncated_completions", False)),
            setting(args, "rlhf_ext.off_policy_mask_threshold"))


@contextlib.contextmanager
def micro_batch(trainer, experience):
    """Around ``training_step``: hand the loss the experience's truncation flags and the actor's entropy."""
    quantile, truncated, threshold = _settings(trainer.args)
    loss_fn = getattr(trainer, "actor_loss_fn", None)
    if loss_fn is None or (quantile is None and not truncated and threshold is None):
        yield
        return
    flags = None
    if truncated:
        flags = getattr(experience, "truncated", None)
        if flags is None:
            raise ValueError(f"{TRUNCATED_FLAG}: this experience has no 'truncated' flags "
                             "(OpenRLHF sets them from vLLM's finish_reason)")
    pending = _Pending(quantile, flags, threshold)
    handle = None
    if quantile is not None:
        def on_actor(_module, _inputs, output):
            if isinstance(output, tuple) and len(output) == 2 and output[1] is not None:
                pending.entropy = getattr(output[1], "entropy", None)

        handle = trainer.actor.register_forward_hook(on_actor)
    loss_fn.pending_masks = pending
    try:
        yield
    finally:
        loss_fn.pending_masks = None
        if handle is not None:
            handle.remove()


def token_keep(
    loss_fn, log_probs, old_log_probs, rollout_log_probs, advantages, action_mask
) -> Optional["torch.Tensor"]:
    """The bool ``[B, T]`` mask of tokens that keep their policy loss, or None (no knob on).
    M2PO's mask (``--rlhf_ext.m2po_threshold``, :mod:`.staleness`) joins these."""
    m2po = staleness.m2po_keep(loss_fn, old_log_probs, rollout_log_probs, action_mask)
    pending = getattr(loss_fn, "pending_masks", None)
    if pending is None:  # no knob on: the common case, every micro-batch
        return m2po
    import torch

    from rlhf_ext.algorithms import off_policy_sequence_mask, top_entropy_mask, truncated_completion_mask

    mask = action_mask.bool()
    keep = mask
    if pending.truncated is not None:
        keep = truncated_completion_mask(keep, pending.truncated.to(mask.device))
    if pending.threshold is not None:
        rows = mask.any(dim=-1)
        m = mask.to(advantages.dtype)
        seq_adv = (advantages * m).sum(-1) / m.sum(-1).clamp(min=1)
        sampling = rollout_log_probs if rollout_log_probs is not None else old_log_probs
        seq_keep = torch.ones_like(rows)
        if bool(rows.any()):
            seq_keep[rows] = off_policy_sequence_mask(seq_adv[rows], log_probs[rows].detach(), sampling[rows],
                                                      mask[rows], float(pending.threshold))
        keep = keep & seq_keep[:, None]
    if pending.quantile is not None:
        entropy = pending.entropy
        if entropy is None:
            raise ValueError(f"{ENTROPY_FLAG}: the actor returned no entropy (is --actor.entropy_coef set?)")
        entropy = entropy[:, -mask.shape[1]:].detach()
        if bool(mask.any()):
            keep = keep & top_entropy_mask(entropy, mask, float(pending.quantile))
    return keep if m2po is None else keep & m2po


def summary(namespace) -> str:
    parts = []
    q = getattr(namespace, "rlhf_ext.top_entropy_quantile", None)
    if q is not None:
        parts.append(f"top_entropy_quantile={q}")
    if getattr(namespace, "rlhf_ext.mask_truncated_completions", False):
        parts.append("mask_truncated_completions")
    d = getattr(namespace, "rlhf_ext.off_policy_mask_threshold", None)
    if d is not None:
        parts.append(f"off_policy_mask_threshold={d}")
    return ", ".join(parts)

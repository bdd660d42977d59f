"""A tour of rlhf_ext.algorithms on a toy batch: ``python -m rlhf_ext.tours.demo``.

Prints every registered advantage estimator on the same binary rewards, then every policy loss
under every aggregation mode and the KL estimators with clipping, so a newcomer can see how the
choices differ before selecting one by name in a training recipe.
"""

from __future__ import annotations

import argparse

import torch

from rlhf_ext.algorithms import (
    LOSS_AGG_MODES,
    aggregate_loss,
    available_advantages,
    available_kl_estimators,
    available_policy_losses,
    get_advantage,
    get_policy_loss,
    host_inputs,
    kl_estimate,
    overlong_penalty,
    zero_variance_groups,
)

# Options an estimator needs that have no universal default.
ESTIMATOR_OPTIONS = {"passk": {"k": 2}}


def _row(values) -> str:
    return " ".join(f"{v:+.3f}" for v in values)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="seed for the toy log-probabilities (default 0)")
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)

    scores = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    print("Toy batch: 3 prompts x 4 samples, binary correctness scores")
    for p, row in enumerate(scores.tolist()):
        print(f"  prompt {p}: {row}")
    print(f"  zero-variance groups (DAPO dynamic sampling drops these): {zero_variance_groups(scores).tolist()}")

    print("\nAdvantages per estimator (rows = prompts):")
    advantages = {}
    # what a host passes to estimators that take more than the scores (opo: response lengths; gdpo:
    # the reward's components, here correctness and a toy format score)
    host = {"lengths": torch.tensor([[3.0, 5, 8, 2], [6, 7, 4, 8], [1, 5, 3, 6]]),
            "components": {"accuracy": scores, "format": torch.tensor([[1.0, 1, 0, 1], [1, 0, 1, 1], [0, 1, 1, 1]])},
            # gigpo: two turns per trajectory, the first from the prompt's state, the score earned at the second
            "turns": [[[(0.0, "start"), (float(s), f"after-{n % 2}")] for n, s in enumerate(row)]
                      for row in scores.tolist()]}
    for name in available_advantages():
        opts = ESTIMATOR_OPTIONS.get(name, {})
        fn = get_advantage(name)
        adv = fn(scores, **opts, **{k: host[k] for k in host_inputs(fn)})
        label = name + "".join(f" {k}={v}" for k, v in opts.items())
        if adv.dim() == 3:  # per turn (gigpo): the first turn's
            adv, label = adv[..., 0], label + " (turn 1)"
        advantages[name] = adv
        print(f"  {label:<24}" + "  |  ".join(_row(r) for r in adv.tolist()))

    # Token level: 12 responses of different lengths, one outcome advantage per response.
    lengths = torch.tensor([3, 5, 8, 2, 6, 7, 4, 8, 1, 5, 3, 6])
    max_len = 8
    mask = (torch.arange(max_len)[None, :] < lengths[:, None]).float()
    old = -torch.rand(12, max_len) * 2
    new = old + 0.3 * torch.randn(12, max_len)
    ref = old + 0.1 * torch.randn(12, max_len)
    adv_tok = advantages["grpo"].reshape(-1, 1).expand(-1, max_len)

    print("\nPolicy losses on GRPO advantages (12 responses, lengths 1-8):")
    print(f"  {'loss':<9}{'clip low':>10}{'clip high':>10}   " + "".join(f"{m:>26}" for m in LOSS_AGG_MODES))
    for name in available_policy_losses():
        opts = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28} if name == "ppo" else {}
        per_tok, metrics = get_policy_loss(name)(new, old, adv_tok, mask, **opts)
        aggs = [aggregate_loss(per_tok, mask, mode, max_len=max_len).item() for mode in LOSS_AGG_MODES]
        # losses without a clip (pg, noclip) report no clip fractions
        clips = "".join(f"{metrics[k].item():>10.3f}" if k in metrics else f"{'-':>10}"
                        for k in ("clip_frac_low", "clip_frac_high"))
        print(f"  {name:<9}{clips}   " + "".join(f"{a:>26.4f}" for a in aggs))

    print("\nKL(pi || ref) per estimator, mean over tokens, clipped to [-0.2, 0.2]:")
    for name in available_kl_estimators():
        kl, m = kl_estimate(new, ref, name, clip=(-0.2, 0.2), mask=mask)
        mean = (kl * mask).sum() / mask.sum()
        print(f"  {name:<4} mean {mean.item():+.4f}   clipped fraction {m['kl_clip_frac'].item():.3f}")

    print("\nDAPO overlong penalty, max_len 8, buffer 4, for lengths", lengths.tolist())
    print("  " + _row(overlong_penalty(lengths, max_len=8, buffer_len=4).tolist()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

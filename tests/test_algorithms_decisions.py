"""Issue 17, item 8: what was decided to stay, with the invariant that makes it safe.

MaxRL advantages reach N-1 for a group with one success (63 at N = 64): kept, because that is the
estimator (the gradient averaged over the successes). What stays bounded is the group's total
weight: the mean |A| over a group is 2(1 - p) <= 2 with p its success rate, GRPO-like.
"""

import torch

from rlhf_ext.algorithms import get_advantage


def test_maxrl_single_success_at_n64_hand_computed():
    scores = torch.zeros(1, 64)
    scores[0, 5] = 1.0
    adv = get_advantage("maxrl")(scores)
    assert adv[0, 5].item() == 63.0
    assert torch.all(adv[0, torch.arange(64) != 5] == -1.0)
    assert adv.sum().item() == 0.0
    assert adv.abs().mean().item() == 2 * (1 - 1 / 64)


def test_maxrl_group_weight_is_bounded_for_every_success_count():
    n = 16
    for k in range(1, n + 1):
        scores = torch.zeros(1, n)
        scores[0, :k] = 1.0
        adv = get_advantage("maxrl")(scores)
        p = k / n
        assert torch.isclose(adv.abs().mean(), torch.tensor(2 * (1 - p)))
        assert torch.isclose(adv.sum(), torch.tensor(0.0), atol=1e-5)
    assert torch.all(get_advantage("maxrl")(torch.zeros(1, n)) == 0)  # no success: no signal

"""One name per clip knob (verl's clip_ratio_low / clip_ratio_high); the old eps_low / eps_high still work
for one release, with a DeprecationWarning, in both directions."""

import inspect

import pytest
import torch

from rlhf_ext.algorithms import accepted_options, get_policy_loss, ppo, ppo_clip_fractions, register_policy_loss
from rlhf_ext.algorithms.registry import POLICY_LOSSES

CLIPPED = ["ppo", "gspo", "cispo", "gmpo", "clip_cov", "dppo_tv", "dppo_kl", "luspo"]


def _inputs():
    torch.manual_seed(0)
    lp = torch.randn(2, 4) * 0.3
    return lp, lp.detach() + torch.randn(2, 4) * 0.2, torch.randn(2, 4), torch.ones(2, 4, dtype=torch.bool)


@pytest.mark.parametrize("name", CLIPPED)
def test_every_clipped_loss_names_its_range_after_verl(name):
    params = inspect.signature(get_policy_loss(name)).parameters
    assert "clip_ratio_low" in params and "clip_ratio_high" in params
    assert "eps_low" not in params and "eps_high" not in params


@pytest.mark.parametrize("name", ["ppo", "gspo"])  # the losses that had eps_low / eps_high; the rest never did
def test_the_old_names_warn_and_give_the_same_loss(name):
    fn = get_policy_loss(name)
    low, high = (3e-4, 4e-4) if name == "gspo" else (0.2, 0.28)
    new_loss, new_metrics = fn(*_inputs(), clip_ratio_low=low, clip_ratio_high=high)
    with pytest.warns(DeprecationWarning, match="eps_low -> clip_ratio_low"):
        old_loss, old_metrics = fn(*_inputs(), eps_low=low, eps_high=high)
    torch.testing.assert_close(old_loss, new_loss)
    assert old_metrics.keys() == new_metrics.keys()


def test_the_old_names_of_ppo_clip_fractions_warn():
    with pytest.warns(DeprecationWarning):
        old = ppo_clip_fractions(*_inputs(), eps_low=0.1, eps_high=0.2)
    assert old == ppo_clip_fractions(*_inputs(), clip_ratio_low=0.1, clip_ratio_high=0.2)


def test_a_knob_under_both_names_is_an_error():
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="both clip_ratio_low and its old name"):
        ppo(*_inputs(), eps_low=0.2, clip_ratio_low=0.2)


def test_a_third_party_loss_with_the_old_names_is_called_with_the_new_ones():
    """Registered (as an entry point module would) with eps_low / eps_high: a DeprecationWarning at
    registration; every host calls it with clip_ratio_low / clip_ratio_high and it gets its own names."""
    seen = {}

    def legacy(log_probs, old_log_probs, advantages, mask, *, eps_low=0.2, eps_high=None, scale=1.0):
        seen.update(eps_low=eps_low, eps_high=eps_high)
        return log_probs * 0, {}

    with pytest.warns(DeprecationWarning, match="'test_legacy_loss'"):
        returned = register_policy_loss("test_legacy_loss")(legacy)
    try:
        assert returned is legacy  # the third-party module keeps its own function
        fn = get_policy_loss("test_legacy_loss")
        options = accepted_options(fn, {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3, "tau_pos": 1.0})
        assert options == {"clip_ratio_low": 0.1, "clip_ratio_high": 0.3}
        fn(*_inputs(), **options)
        assert seen == {"eps_low": 0.1, "eps_high": 0.3}
        fn(*_inputs(), eps_low=0.05)  # its own names still reach it
        assert seen["eps_low"] == 0.05
    finally:
        POLICY_LOSSES.unregister("test_legacy_loss")


def test_a_loss_with_the_new_names_is_registered_as_it_is():
    def current(log_probs, old_log_probs, advantages, mask, *, clip_ratio_low=0.2, clip_ratio_high=0.2):
        return log_probs * 0, {}

    register_policy_loss("test_current_loss")(current)
    try:
        assert get_policy_loss("test_current_loss") is current
    finally:
        POLICY_LOSSES.unregister("test_current_loss")

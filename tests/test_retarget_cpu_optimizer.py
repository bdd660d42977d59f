"""rlhf_ext.patches.retarget.cpu_optimizer: which DeepSpeed configs get torch's AdamW on the CPU target.
DeepSpeed building it for OpenRLHF's real config is checked in tests/test_retarget_cpu_target.py."""

import copy

from rlhf_ext.patches.retarget.cpu_optimizer import TORCH_ADAM, with_torch_adam


def _config(kind="AdamW", offload="none", **params):
    return {"optimizer": {"type": kind, "params": {"lr": 1e-5, **params}},
            "zero_optimization": {"stage": 0, "offload_optimizer": {"device": offload}}}


def test_adam_and_adamw_get_torchs_implementation_without_touching_the_input():
    for kind in ("AdamW", "Adam", "adamw"):
        config = _config(kind)
        kept = copy.deepcopy(config)
        out = with_torch_adam(config)
        assert out["optimizer"]["params"] == {"lr": 1e-5, TORCH_ADAM: True}
        assert config == kept
        assert {k: v for k, v in out.items() if k != "optimizer"} == {k: v for k, v in kept.items() if k != "optimizer"}


def test_other_optimizers_offload_and_an_explicit_choice_are_left_alone():
    for config in (_config("Muon"), _config(offload="cpu"), _config(**{TORCH_ADAM: False}), {"zero_optimization": {}}):
        assert with_torch_adam(config) is config

"""SimPO in OpenRLHF's train_dpo through the plugin: flags, validation, the checked seams, the loss module."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest
import torch

from rlhf_ext.patches.openrlhf import compat
from rlhf_ext.patches.openrlhf.dpo import SimPOLoss
from rlhf_ext.patches.openrlhf.dpo_cli import finalize, is_openrlhf_dpo_parser

DPO = [sys.executable, "-m", "openrlhf.cli.train_dpo"]


def _ns(**values):
    ns = argparse.Namespace()
    defaults = {"model.loss_type": None, "model.ipo_enable": False, "model.simpo_gamma": None, "model.beta": None,
                "model.label_smoothing": 0.0, "model.nll_loss_coef": 0.0}
    for key, value in {**defaults, **values}.items():
        setattr(ns, key, value)
    return ns


def test_finalize_fills_simpo_defaults_and_keeps_dpo_defaults():
    ns = _ns(**{"model.loss_type": "simpo"})
    finalize(ns)
    assert (getattr(ns, "model.beta"), getattr(ns, "model.simpo_gamma")) == (2.0, 1.0)
    ns = _ns()
    finalize(ns)
    assert getattr(ns, "model.loss_type") == "dpo" and getattr(ns, "model.beta") == 0.1
    ns = _ns(**{"model.loss_type": "ipo", "model.beta": 0.5})
    finalize(ns)
    assert getattr(ns, "model.ipo_enable") is True and getattr(ns, "model.beta") == 0.5
    ns = _ns(**{"model.ipo_enable": True})
    finalize(ns)
    assert getattr(ns, "model.loss_type") == "ipo"


@pytest.mark.parametrize("values, message", [
    ({"model.loss_type": "simpo", "model.ipo_enable": True}, "contradicts"),
    ({"model.loss_type": "dpo", "model.simpo_gamma": 0.5}, "applies to --model.loss_type simpo"),
    ({"model.loss_type": "simpo", "model.simpo_gamma": float("inf")}, "finite"),
    ({"model.loss_type": "simpo", "model.beta": -1.0}, "positive"),
    ({"model.loss_type": "simpo", "model.label_smoothing": 0.5}, "label_smoothing"),
])  # fmt: skip
def test_finalize_rejects_bad_combinations(values, message):
    with pytest.raises(ValueError, match=message):
        finalize(_ns(**values))


def test_dpo_parser_is_recognised_and_the_ppo_parser_is_not():
    p = argparse.ArgumentParser()
    for opt in ("--model.beta", "--model.ipo_enable", "--model.label_smoothing", "--model.nll_loss_coef",
                "--data.chosen_key", "--data.rejected_key"):
        p.add_argument(opt)
    assert is_openrlhf_dpo_parser(p)
    assert not is_openrlhf_dpo_parser(argparse.ArgumentParser())


def test_dpo_trainer_seams_match_the_installed_openrlhf():
    from rlhf_ext.patches import install_flash_attn_fallback

    install_flash_attn_fallback()  # CPU: openrlhf.models needs the flash_attn names
    module = importlib.import_module("openrlhf.trainer.dpo_trainer")
    assert compat.check_module(module) == []


def test_simpo_loss_module_matches_dpo_loss_contract():
    loss_fn = SimPOLoss(beta=2.0, gamma=1.0)
    chosen = torch.tensor([-1.0, -0.5], requires_grad=True)
    rejected = torch.tensor([-2.0, -0.5])
    loss, c_reward, r_reward = loss_fn(chosen, rejected, torch.zeros(2), torch.zeros(2))
    # z = [1, -1]: mean(log(1+e^-1), log(1+e)) = log(1+e^-1) + 0.5
    assert loss.item() == pytest.approx(0.31326168751822286 + 0.5, abs=1e-6)
    assert c_reward.tolist() == [-2.0, -1.0] and r_reward.tolist() == [-4.0, -1.0]
    loss.backward()
    assert chosen.grad is not None and torch.all(chosen.grad < 0)
    assert loss_fn.last_metrics["chosen_avg_logp"] == pytest.approx(-0.75)


def test_train_dpo_help_lists_the_plugin_flags():
    # both CLI processes started together: each spends ~10 s importing OpenRLHF on one core
    procs = [subprocess.Popen(DPO + ["--plugin", "rlhf_ext", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for argv in (["--help"], ["--model.loss_type", "dpo", "--model.simpo_gamma", "1"])]  # fmt: skip
    try:
        (help_out, help_err), (_, bad_err) = [p.communicate(timeout=300) for p in procs]
    finally:  # a timeout must not leave the other CLI process behind
        for p in procs:
            p.kill()
    assert procs[0].returncode == 0, help_err[-2000:]
    assert "--model.loss_type {dpo,ipo,simpo}" in help_out and "--model.simpo_gamma" in help_out
    assert procs[1].returncode == 2 and "--model.simpo_gamma applies to --model.loss_type simpo" in bad_err

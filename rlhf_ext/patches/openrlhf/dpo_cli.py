"""The plugin's flags on ``python -m openrlhf.cli.train_dpo``.

Same mechanism as the PPO flags (:mod:`.cli`): the driver's argparse hook recognises OpenRLHF's
DPO parser by its options, checks the DPO trainer's seams, adds

* ``--model.loss_type dpo|ipo|simpo`` (``ipo`` is OpenRLHF's ``--model.ipo_enable``);
* ``--model.simpo_gamma`` (SimPO's target margin, default 1.0),

and validates the combination after parsing. With ``simpo``, ``--model.beta`` is SimPO's beta; left
unset it is 2.0 instead of DPO's 0.1. ``--model.nll_loss_coef`` (OpenRLHF's) adds the SFT term.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys

from . import compat
from .parser_hook import extended_parse

DPO_PARSER_OPTIONS = (
    "--model.beta",
    "--model.ipo_enable",
    "--model.label_smoothing",
    "--model.nll_loss_coef",
    "--data.chosen_key",
    "--data.rejected_key",
)
LOSS_TYPES = ("dpo", "ipo", "simpo")
DPO_DEFAULT_BETA = 0.1  # OpenRLHF's default, restored when --model.beta is not given
SIMPO_DEFAULT_BETA = 2.0
SIMPO_DEFAULT_GAMMA = 1.0
PATCH_NAME = "command-line flags (train_dpo)"


def is_openrlhf_dpo_parser(parser: argparse.ArgumentParser) -> bool:
    options = getattr(parser, "_option_string_actions", {})
    return all(opt in options for opt in DPO_PARSER_OPTIONS)


def extend_parser(parser: argparse.ArgumentParser) -> None:
    """Check the DPO trainer's seams, then add ``--model.loss_type`` and ``--model.simpo_gamma``."""
    from . import DPO_TRAINER

    compat.check_version()
    compat.apply_module(importlib.import_module(DPO_TRAINER))
    actions = parser._option_string_actions
    if "--model.loss_type" in actions:
        raise compat.OpenRLHFCompatibilityError(
            f"rlhf_ext cannot patch OpenRLHF {compat.openrlhf_version()}: patch '{PATCH_NAME}': train_dpo already "
            "has --model.loss_type"
        )
    beta = actions["--model.beta"]
    if beta.default != DPO_DEFAULT_BETA:
        raise compat.OpenRLHFCompatibilityError(
            f"rlhf_ext cannot patch OpenRLHF {compat.openrlhf_version()}: patch '{PATCH_NAME}': --model.beta "
            f"defaults to {beta.default!r}, expected {DPO_DEFAULT_BETA}"
        )
    beta.default = None  # to tell "not given" apart: SimPO wants a different default
    beta.help = f"DPO/IPO beta (default {DPO_DEFAULT_BETA}); with --model.loss_type simpo, SimPO's beta " \
                f"(default {SIMPO_DEFAULT_BETA})"
    group = parser.add_argument_group("rlhf_ext plugin", "Flags added by --plugin rlhf_ext (see docs/data.md).")
    group.add_argument(
        "--model.loss_type", choices=LOSS_TYPES, default=None,
        help="preference loss: dpo (default), ipo (= --model.ipo_enable), simpo (reference-free, length-normalised "
        "margin, Meng et al. 2024; add --model.nll_loss_coef for the SFT term on long reasoning traces)",
    )  # fmt: skip
    group.add_argument(
        "--model.simpo_gamma", type=float, default=None, metavar="GAMMA",
        help=f"SimPO target margin gamma (default {SIMPO_DEFAULT_GAMMA}, i.e. gamma/beta = 0.5 at beta 2)",
    )  # fmt: skip


def _ns(namespace, dest, default=None):
    return getattr(namespace, dest, default)


def finalize(namespace) -> None:
    """Validate the flags and fill in defaults; raises ``ValueError`` naming the flag."""
    kind = _ns(namespace, "model.loss_type")
    ipo = bool(_ns(namespace, "model.ipo_enable", False))
    if kind is None:
        kind = "ipo" if ipo else "dpo"
    if kind != "ipo" and ipo:
        raise ValueError(f"--model.ipo_enable contradicts --model.loss_type {kind}")
    if kind == "ipo":
        setattr(namespace, "model.ipo_enable", True)
    setattr(namespace, "model.loss_type", kind)
    gamma = _ns(namespace, "model.simpo_gamma")
    if kind != "simpo" and gamma is not None:
        raise ValueError(f"--model.simpo_gamma applies to --model.loss_type simpo, not {kind}")
    if kind == "simpo":
        gamma = SIMPO_DEFAULT_GAMMA if gamma is None else gamma
        if not math.isfinite(gamma):
            raise ValueError(f"--model.simpo_gamma must be a finite number, got {gamma}")
        setattr(namespace, "model.simpo_gamma", gamma)
    beta = _ns(namespace, "model.beta")
    if beta is None:
        beta = SIMPO_DEFAULT_BETA if kind == "simpo" else DPO_DEFAULT_BETA
    if not (math.isfinite(beta) and beta > 0):
        raise ValueError(f"--model.beta must be a positive number, got {beta}")
    setattr(namespace, "model.beta", beta)
    smoothing = _ns(namespace, "model.label_smoothing", 0.0)
    if kind == "simpo" and not 0 <= smoothing < 0.5:
        raise ValueError(f"--model.label_smoothing must be in [0, 0.5) for simpo, got {smoothing}")


def summary(namespace) -> str:
    kind = _ns(namespace, "model.loss_type")
    parts = [f"loss_type={kind}", f"beta={_ns(namespace, 'model.beta'):g}"]
    if kind == "simpo":
        parts.append(f"gamma={_ns(namespace, 'model.simpo_gamma'):g}")
    parts.append(f"nll_loss_coef={_ns(namespace, 'model.nll_loss_coef', 0):g}")
    line = "rlhf_ext: " + ", ".join(parts)
    if kind == "simpo" and not _ns(namespace, "model.nll_loss_coef", 0):
        line += ("\nrlhf_ext: note: SimPO without --model.nll_loss_coef can degrade long reasoning traces; "
                 "an SFT term on the chosen answers (e.g. --model.nll_loss_coef 0.1 to 1) anchors them")
    return line


def parse_with_plugin(parser, original, args=None, namespace=None):
    """The argparse hook's path for OpenRLHF's DPO parser."""
    parsed, extras, _ = extended_parse(parser, original, args, namespace, extend=extend_parser, finalize=finalize)
    sys.stderr.write(summary(parsed) + "\n")
    return parsed, extras

"""The plugin's settings as they travel inside OpenRLHF's ``args``, and OpenRLHF's own names.

OpenRLHF pickles ``args`` (a nested namespace built by ``openrlhf.utils.config.hierarchize``) into
every Ray actor, so the plugin's flags arrive there as ``args.algo.kl.clip`` and so on. Readers
here fall back to defaults when a setting is missing (an ``args`` built without the plugin's
parser, as OpenRLHF's own tests do), which gives OpenRLHF's behaviour unchanged.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

# What OpenRLHF 0.11.x implements itself; these names keep OpenRLHF's exact code path.
OPENRLHF_ESTIMATORS = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce")
OPENRLHF_POLICY_LOSSES = ("ppo", "gspo")
OPENRLHF_LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean")
OPENRLHF_KL_CLIP = (-10.0, 10.0)  # the fixed clamp in openrlhf.models.utils.compute_approx_kl

# REINFORCE++ (arXiv 2501.03262) whitens token advantages over the whole batch; only plain
# REINFORCE++ honours --algo.advantage.gamma, as OpenRLHF's own "reinforce" does.
WHITENED_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")
DISCOUNTED_ESTIMATORS = ("reinforce_pp",)

ADVANTAGE_INPUTS = ("reward", "score")

# Marker for "no --algo.kl.clip given": OpenRLHF's own compute_approx_kl runs untouched.
KL_CLIP_OPENRLHF_DEFAULT = "openrlhf-default"


def rlhf_ext_view(namespace):
    """The flat ``rlhf_ext.*`` entries of a parsed (not yet hierarchized) namespace as ``args.rlhf_ext.*``,
    so the readers written for the actors' ``args`` validate the flags in the driver."""
    from types import SimpleNamespace

    return SimpleNamespace(rlhf_ext=SimpleNamespace(**{k.split(".", 1)[1]: getattr(namespace, k, None)
                                                       for k in vars(namespace) if k.startswith("rlhf_ext.")}))


def setting(args, dotted: str, default: Any = None) -> Any:
    """``args.a.b.c`` for ``dotted="a.b.c"``, or ``default`` when any part is missing."""
    node = args
    for part in dotted.split("."):
        if node is None or not hasattr(node, part):
            return default
        node = getattr(node, part)
    return default if node is None else node


def step_metrics(args) -> bool:
    """``--rlhf_ext.step_metrics``: whether the per-step metrics rlhf_ext adds to OpenRLHF's are
    computed (split clip fractions, ``kl_clip_frac``, ``zero_variance_group_frac``, update counts).
    Each costs a few passes over the step's token tensors; ``off`` leaves OpenRLHF's own work alone."""
    return setting(args, "rlhf_ext.step_metrics", "all") != "off"


def parse_option_value(text: str) -> Any:
    """``"4"`` -> 4, ``"1e-6"`` -> 1e-6, ``"true"``/``"false"`` -> bool, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_options(pairs: Optional[Sequence[str]], flag: str) -> Dict[str, Any]:
    """``["k=4", "eps=1e-6"]`` -> ``{"k": 4, "eps": 1e-6}``; a malformed pair raises ``ValueError``."""
    options: Dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = str(pair).partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(f"{flag} takes KEY=VALUE with KEY a Python identifier, got {pair!r}")
        options[key] = parse_option_value(value)
    return options


def estimator_options(args, name: str) -> Dict[str, Any]:
    """Keyword options for the registered estimator ``name`` (``--algo.advantage.option``, ``passk_k``)."""
    options = parse_options(setting(args, "algo.advantage.option"), "--algo.advantage.option")
    passk_k = setting(args, "algo.advantage.passk_k")
    if name == "passk" and passk_k is not None:
        options["k"] = int(passk_k)
    return options


def policy_loss_options(args) -> Dict[str, Any]:
    return parse_options(setting(args, "actor.policy_loss_option"), "--actor.policy_loss_option")


def kl_clip(args):
    """``KL_CLIP_OPENRLHF_DEFAULT``, ``None`` (no clamp) or ``(lo, hi)`` from ``--algo.kl.clip``."""
    value = setting(args, "algo.kl.clip")
    if value is None:
        return KL_CLIP_OPENRLHF_DEFAULT
    return normalize_kl_clip(value)


def normalize_kl_clip(value) -> Optional[Tuple[float, float]]:
    """``"none"``/``["none"]`` -> None; ``[lo, hi]`` (strings or numbers) -> ``(lo, hi)`` with lo < hi
    (:func:`rlhf_ext.algorithms.parse_kl_clip`, the rule every host shares)."""
    from rlhf_ext.algorithms.kl import parse_kl_clip

    return parse_kl_clip(value, setting="--algo.kl.clip", form="LO HI", bounds=("LO", "HI"))


def loss_agg_mode(args) -> str:
    from rlhf_ext.algorithms import LOSS_AGG_MODES

    mode = setting(args, "actor.loss_agg_mode", "token-mean")
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown --actor.loss_agg_mode {mode!r}; choose from {', '.join(LOSS_AGG_MODES)}")
    return mode


def loss_agg_max_len(args) -> Tuple[Optional[int], str]:
    """The constant of ``seq-mean-token-sum-norm`` and where it came from.

    ``--actor.loss_agg_max_len`` if given, else ``--rollout.max_new_tokens`` (the generation
    budget, Dr.GRPO's constant), else ``--data.max_len`` (prompt + response, an upper bound of
    the response length when OpenRLHF sizes generation per prompt).
    """
    for dotted, flag in (
        ("actor.loss_agg_max_len", "--actor.loss_agg_max_len"),
        ("rollout.max_new_tokens", "--rollout.max_new_tokens"),
        ("data.max_len", "--data.max_len"),
    ):
        value = setting(args, dotted)
        if value is not None:
            return int(value), flag
    return None, "the padded batch width"


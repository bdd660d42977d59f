"""On-policy distillation flags on ``train_ppo_ray --plugin rlhf_ext``: ``--rlhf_ext.teacher`` and
``--rlhf_ext.distill.*`` (verl 0.9.1's ``DistillationLossConfig`` names and defaults), checked at start-up.

The checks run in the driver before Ray starts, so a bad teacher costs no cluster time:

* ``--rlhf_ext.teacher PATH`` or ``KEY1=PATH1,KEY2=PATH2`` (several teachers, routed by the data field
  ``--rlhf_ext.distill.teacher_key``): every path must be a local model directory with a ``config.json``;
* each teacher must share the student's tokenizer: the same vocabulary (token -> id map, special
  tokens included; the embedding's padded ``vocab_size`` may differ), else the run is refused naming both
  models (a teacher's log-probs and top-k ids index the student's vocabulary; cross-tokenizer
  distillation is out of scope);
* the ``--rlhf_ext.distill.*`` values go through :class:`rlhf_ext.algorithms.DistillationConfig`'s checks
  (``k1`` as a backpropagated loss is refused there, with the reason);
* OpenRLHF makes experiences only with a reward (a reward model, ``--reward.remote_url`` or
  ``--reward.functions``): ``use_task_rewards`` without one is refused, and so is distillation alone
  without one (OpenRLHF's experience maker would fail at the first batch);
* ``forward_kl_topk`` needs the student's logits per sample: refused with ``--ds.packing_samples``
  (OpenRLHF's packed forward returns packed logits) and with ``--train.dynamic_batch_enable``.

This module runs in the driver at argument parsing: no torch or OpenRLHF imports at module level.
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, Optional, Tuple

TEACHER_FLAG = "--rlhf_ext.teacher"
PREFIX = "--rlhf_ext.distill."
DEFAULT_KEY = ""  # the key of a single, unrouted teacher
_KEY_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")

# verl 0.9.1 DistillationLossConfig defaults (verl/workers/config/distillation.py), as DistillationConfig's
DEFAULTS = {"loss_mode": "k3", "topk": 128, "use_policy_gradient": True, "use_task_rewards": True,
            "distillation_loss_coef": 1.0, "log_prob_min_clamp": -10.0, "loss_max_clamp": 10.0,
            "teacher_key": "data_source"}  # fmt: skip


def _bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _optional_float(text: str) -> Optional[float]:
    if str(text).strip().lower() in ("none", "null", "off"):
        return None
    return float(text)


def _typed(cast, name: str):
    import argparse

    def parse(text: str):
        try:
            return cast(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{PREFIX}{name}: {exc}") from None

    parse.__name__ = cast.__name__.lstrip("_")
    return parse


def add_arguments(group) -> None:
    group.add_argument(
        TEACHER_FLAG, default=None, metavar="PATH | KEY=PATH,...",
        help="on-policy distillation: a teacher model (same tokenizer as the student) scores every rollout "
        "batch in its own Ray actor group, sized like the reference model (--ref.num_nodes x "
        "--ref.num_gpus_per_node); several teachers as KEY1=PATH1,KEY2=PATH2, each sample routed by its "
        "data field --rlhf_ext.distill.teacher_key (docs/distillation.md)",
    )  # fmt: skip
    d = DEFAULTS
    group.add_argument(PREFIX + "loss_mode", default=d["loss_mode"], metavar="NAME",
                       help="distillation loss (verl's loss_mode): kl/k1, abs, mse/k2, low_var_kl/k3, "
                            "forward_kl_topk (default k3)")  # fmt: skip
    group.add_argument(PREFIX + "topk", type=_typed(int, "topk"), default=d["topk"], metavar="K",
                       help="teacher top-k size for forward_kl_topk (default 128)")
    group.add_argument(PREFIX + "use_policy_gradient", type=_typed(_bool, "use_policy_gradient"),
                       default=d["use_policy_gradient"], metavar="true|false",
                       help="true (default, verl's): -loss is a per-token advantage through the policy loss "
                            "(Thinking Machines' recipe); false: the loss is backpropagated (GKD)")  # fmt: skip
    group.add_argument(PREFIX + "use_task_rewards", type=_typed(_bool, "use_task_rewards"),
                       default=d["use_task_rewards"], metavar="true|false",
                       help="true (default): task policy loss + coef x distillation; false: distillation alone")
    group.add_argument(PREFIX + "distillation_loss_coef", type=_typed(float, "distillation_loss_coef"),
                       default=d["distillation_loss_coef"], metavar="C",
                       help="weight of the distillation term with use_task_rewards (default 1.0)")
    group.add_argument(PREFIX + "log_prob_min_clamp", type=_typed(_optional_float, "log_prob_min_clamp"),
                       default=d["log_prob_min_clamp"], metavar="LP|none",
                       help="floor of the top-k log-probs in forward_kl_topk (default -10; none: off)")
    group.add_argument(PREFIX + "loss_max_clamp", type=_typed(_optional_float, "loss_max_clamp"),
                       default=d["loss_max_clamp"], metavar="C|none",
                       help="per-token loss clamped to [-C, C] (default 10; none: off)")
    group.add_argument(PREFIX + "teacher_key", default=d["teacher_key"], metavar="FIELD",
                       help="data field naming each sample's teacher when --rlhf_ext.teacher has KEY=PATH "
                            "entries (default data_source, verl's)")  # fmt: skip
    group.add_argument(PREFIX + "dump_dir", default=None, metavar="DIR",
                       help="debugging: save each training micro-batch's sequences, masks and the teacher "
                            "values the loss used (torch files, one per micro-batch) under DIR")  # fmt: skip


def parse_teacher_spec(text: str) -> Dict[str, str]:
    """``PATH`` -> ``{"": PATH}``; ``KEY1=PATH1,KEY2=PATH2`` -> ``{KEY1: PATH1, KEY2: PATH2}``.

    A plain path may contain neither ``,`` nor start with ``KEY=``; keys are ``[A-Za-z0-9_.-]+``."""
    text = (text or "").strip()
    if not text:
        raise ValueError(f"{TEACHER_FLAG} is empty")
    parts = [p.strip() for p in text.split(",")]
    keyed = [p.partition("=") for p in parts]
    is_keyed = [bool(sep) and bool(_KEY_RE.match(key)) and "/" not in key for key, sep, _ in keyed]
    if not any(is_keyed):
        if len(parts) > 1:
            raise ValueError(f"{TEACHER_FLAG} {text!r}: several teachers are written KEY1=PATH1,KEY2=PATH2")
        return {DEFAULT_KEY: text}
    if not all(is_keyed):
        bad = [p for p, ok in zip(parts, is_keyed) if not ok]
        raise ValueError(f"{TEACHER_FLAG} {text!r}: {bad[0]!r} is not KEY=PATH (KEY: letters, digits, _ . -)")
    out: Dict[str, str] = {}
    for key, _, path in keyed:
        if key in out:
            raise ValueError(f"{TEACHER_FLAG}: teacher key {key!r} is given twice")
        if not path.strip():
            raise ValueError(f"{TEACHER_FLAG}: teacher {key!r} has no path")
        out[key] = path.strip()
    return out


def _vocabulary(path: str) -> Tuple[Dict[str, int], Optional[int]]:
    """The tokenizer's token -> id map (added tokens included) and the model config's ``vocab_size``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    config = os.path.join(path, "config.json")
    with open(config, encoding="utf-8") as fh:
        cfg = json.load(fh)
    vocab_size = cfg.get("vocab_size", (cfg.get("text_config") or {}).get("vocab_size"))
    return tok.get_vocab(), vocab_size


def check_same_tokenizer(teacher: str, student: str) -> None:
    """Refuse a teacher whose vocabulary differs from the student's, naming both (cross-tokenizer: out of scope)."""
    t_vocab, t_size = _vocabulary(teacher)
    s_vocab, s_size = _vocabulary(student)
    # The embedding sizes may differ (Qwen2.5 pads 1.5B to 151936 rows, 7B to 152064) as long as the tokenizers
    # agree: the teacher's top-k is then taken over the student's rows only (teacher.score_sequences).
    if t_vocab != s_vocab:
        only_t = sorted(set(t_vocab) - set(s_vocab))[:3]
        only_s = sorted(set(s_vocab) - set(t_vocab))[:3]
        moved = sorted(k for k in set(t_vocab) & set(s_vocab) if t_vocab[k] != s_vocab[k])[:3]
        raise ValueError(
            f"{TEACHER_FLAG}: the teacher {teacher} does not share the student's ({student}) tokenizer: "
            f"the vocabularies differ ({len(t_vocab)} vs {len(s_vocab)} tokens, model vocab_size {t_size} vs "
            f"{s_size}; only the teacher's: {only_t}, only the student's: {only_s}, other ids: {moved}). On-policy "
            "distillation compares the two models' log-probs of the same token ids, so teacher and student must "
            "use one tokenizer; cross-tokenizer distillation is out of scope"
        )


def _ns(namespace, dest, default=None):
    return getattr(namespace, dest, default)


def distill_config(namespace):
    """:class:`rlhf_ext.algorithms.DistillationConfig` from the parsed flags (raises ValueError naming the flag)."""
    from rlhf_ext.algorithms import DistillationConfig, available_distillation_losses

    values = {name: _ns(namespace, "rlhf_ext.distill." + name, default) for name, default in DEFAULTS.items()}
    if values["loss_mode"] not in available_distillation_losses():
        raise ValueError(f"{PREFIX}loss_mode {values['loss_mode']!r} is unknown; registered: "
                         f"{', '.join(available_distillation_losses())}")  # fmt: skip
    try:
        return DistillationConfig(**values)
    except ValueError as exc:
        raise ValueError(f"{PREFIX}*: {exc}") from None


def _has_reward(namespace) -> bool:
    return bool(_ns(namespace, "reward.remote_url") or _ns(namespace, "reward.model_name_or_path"))


def finalize(namespace) -> None:
    """Check the distillation flags (driver, after the reward flags were resolved). Raises ValueError."""
    spec = _ns(namespace, "rlhf_ext.teacher")
    touched = [name for name, default in DEFAULTS.items() if _ns(namespace, "rlhf_ext.distill." + name, default)
               != default]  # fmt: skip
    if spec is None:
        if touched:
            raise ValueError(f"{PREFIX}{touched[0]} applies only with {TEACHER_FLAG} PATH")
        return
    teachers = parse_teacher_spec(spec)
    for key, path in teachers.items():
        name = f"teacher {key!r} " if key else "teacher "
        if not os.path.isdir(path):
            raise ValueError(f"{TEACHER_FLAG}: {name}path {path} does not exist or is not a directory (a local "
                             "Hugging Face model directory; download hub models first)")  # fmt: skip
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{TEACHER_FLAG}: {name}path {path} has no config.json (not a model directory)")
    config = distill_config(namespace)
    student = _ns(namespace, "actor.model_name_or_path")
    if student and os.path.isdir(student):
        for path in teachers.values():
            check_same_tokenizer(path, student)
    if not _has_reward(namespace):
        if config.use_task_rewards:
            raise ValueError(f"{PREFIX}use_task_rewards true (the default) needs a task reward: give "
                             "--reward.remote_url, --reward.functions or --reward.model_name_or_path, or set "
                             f"{PREFIX}use_task_rewards false to distil only")  # fmt: skip
        raise ValueError(f"{PREFIX}use_task_rewards false still needs a reward source: OpenRLHF's experience maker "
                         "scores every rollout (the score is logged, not trained on); give --reward.functions "
                         "math or another --reward.remote_url")  # fmt: skip
    if config.uses_topk:
        if _ns(namespace, "ds.packing_samples", False):
            raise ValueError(f"{PREFIX}loss_mode {config.loss_mode} needs the student's per-sample logits, which "
                             "OpenRLHF's packed forward (--ds.packing_samples) does not give; drop that flag")
    if _ns(namespace, "train.dynamic_batch_enable", False):
        raise ValueError(f"{TEACHER_FLAG} is not supported with --train.dynamic_batch_enable: the teacher's "
                         "values travel per sample and are re-padded per micro-batch, which the packed "
                         "dynamic batches do not keep")  # fmt: skip


def summary(namespace) -> Optional[str]:
    spec = _ns(namespace, "rlhf_ext.teacher")
    if spec is None:
        return None
    config = distill_config(namespace)
    teachers = parse_teacher_spec(spec)
    routed = "" if DEFAULT_KEY in teachers else f", routed by the data field {config.teacher_key!r}"
    return (f"distillation: {len(teachers)} teacher(s){routed}, loss_mode={config.loss_mode}, "
            f"use_policy_gradient={config.use_policy_gradient}, use_task_rewards={config.use_task_rewards}, "
            f"coef={config.distillation_loss_coef}; teacher group sized like the reference model "
            "(KL-to-initial monitoring unchanged)")


__all__ = ["DEFAULTS", "TEACHER_FLAG", "add_arguments", "check_same_tokenizer", "distill_config", "finalize",
           "parse_teacher_spec", "summary"]

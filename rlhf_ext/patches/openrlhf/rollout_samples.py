"""A bounded sample of each step's training rollouts in the run record (``rollout_samples.jsonl``).

Seam: ``BasePPOTrainer._compute_rollout_stats(self, experiences)`` in the PPOTrainer actor. OpenRLHF
calls it in ``train_step`` right after ``make_experience_batch``, so the experiences hold everything
a reader wants beside the curves: the prompt text, the response tokens (``sequences`` masked by
``action_mask``, which is aligned with ``sequences[:, 1:]``; with a multi-turn agent also the
``turns``: the model's and the environment's segments in order, :func:`turn_spans`), the reward and the reward function's
``extra_logs`` (its components, in ``info``), the advantages, ``truncated`` and the label. It runs
before dynamic batching reshuffles the rows, on every step, and its result is left untouched.

Which rollouts: :func:`rlhf_ext.runs.select_rollout_samples` (whole prompt groups in a fixed
prompt order, ``--rlhf_ext.rollout_samples`` per step, 0 = off), at most
``--rlhf_ext.rollout_samples_total`` in the run; only the chosen rows are decoded. Recording never
stops training: a failure becomes a ``rollout_samples_error`` event with the reason.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Dict, List, Sequence

from rlhf_ext import runs

from . import run_record
from .config import setting

logger = logging.getLogger(__name__)

# what OpenRLHF itself puts into Experience.info; the rest is the reward function's extra_logs, except
# the step-level values rlhf_ext's own patches copy into every row (:func:`not_reward_keys`)
OPENRLHF_INFO_KEYS = frozenset({"reward", "score", "response_clip_ratio", "kl", "logprobs_diff", "group_reward_std",
                                "return", "response_length", "total_length"})


def is_reward_component(key: str) -> bool:
    """Whether an ``Experience.info`` key is one of the reward function's ``extra_logs`` (a component or flag)."""
    from .advantages import ADVANTAGE_STD_KEY, ZERO_VARIANCE_KEY
    from .kl import KL_CLIP_FRAC_KEY
    from .mismatch import METRIC_PREFIX as MISMATCH_PREFIX
    from .rollout_correction import METRIC_PREFIX as CORRECTION_PREFIX

    return (key not in OPENRLHF_INFO_KEYS and key not in (ADVANTAGE_STD_KEY, ZERO_VARIANCE_KEY, KL_CLIP_FRAC_KEY)
            and not key.startswith((MISMATCH_PREFIX, CORRECTION_PREFIX)))


def per_step_cap(args) -> int:
    return int(setting(args, "rlhf_ext.rollout_samples", runs.SAMPLES_PER_STEP))


def total_cap(args) -> int:
    return int(setting(args, "rlhf_ext.rollout_samples_total", runs.SAMPLES_TOTAL))


def _row_value(value: Any, i: int):
    """Row ``i`` of a per-sample info value (a (B,) tensor or a list), as a Python number or None."""
    try:
        v = value[i]
    except (TypeError, IndexError, KeyError):
        return None
    item = getattr(v, "item", None)
    if callable(item):
        try:
            v = item() if getattr(v, "numel", lambda: 1)() == 1 else None
        except (TypeError, ValueError, RuntimeError):
            return None
    return v if isinstance(v, (int, float, bool)) else None


def experience_rows(experiences: Sequence[Any]) -> List[tuple]:
    """``(experience, row)`` for every rollout of the step, in order, with its prompt text."""
    rows = []
    for exp in experiences:
        prompts = list(getattr(exp, "prompts", None) or [])
        n = int(exp.sequences.size(0)) if getattr(exp, "sequences", None) is not None else len(prompts)
        for i in range(n):
            rows.append((exp, i, str(prompts[i]) if i < len(prompts) else ""))
    return rows


def turn_spans(action_mask, attention_mask=None) -> List[tuple]:
    """``(role, start, end)`` over ``action_mask`` positions from the first response token on: runs of
    model tokens (``"assistant"``) and of tokens the model did not write (``"environment"``: a
    multi-turn agent's feedback, which OpenRLHF leaves out of the mask); padding (``attention_mask``
    0, aligned with ``sequences``) is not a turn. One span = a single-turn response."""
    mask = [bool(v) for v in action_mask.tolist()]
    valid = len(mask)
    if attention_mask is not None:
        att = attention_mask.tolist()[1:1 + len(mask)]
        while valid > 0 and not att[valid - 1]:
            valid -= 1
    if True not in mask[:valid]:
        return []
    spans, start = [], mask.index(True)
    for t in range(start + 1, valid + 1):
        if t == valid or mask[t] != mask[start]:
            spans.append(("assistant" if mask[start] else "environment", start, t))
            start = t
    return spans


def turns_of(exp, i: int, tokenizer) -> List[Dict[str, Any]]:
    """The turns of row ``i`` (agents); empty for a single-turn response."""
    att = exp.attention_mask[i] if getattr(exp, "attention_mask", None) is not None else None
    spans = turn_spans(exp.action_mask[i], att)
    if len(spans) < 2:
        return []
    ids = exp.sequences[i]
    # action_mask[t] marks sequences[t + 1]
    return [{"role": role, "text": tokenizer.decode(ids[a + 1:b + 1].tolist(), skip_special_tokens=True),
             "tokens": b - a} for role, a, b in spans]


def sample_records(step: int, experiences: Sequence[Any], tokenizer, cap: int) -> List[Dict[str, Any]]:
    """The chosen rollouts of one step as ``rollout_samples.jsonl`` records (decoded, clipped)."""
    rows = experience_rows(experiences)
    chosen = runs.select_rollout_samples([p for _, _, p in rows], cap)
    out = []
    for index in chosen:
        exp, i, prompt = rows[index]
        mask = exp.action_mask[i].bool()
        # action_mask[t] marks sequences[t + 1] (OpenRLHF's per-sample Experience: action_mask = mask[1:])
        response_ids = exp.sequences[i, 1 : 1 + mask.numel()][mask]
        response = tokenizer.decode(response_ids.tolist(), skip_special_tokens=True)
        advantage = None
        if getattr(exp, "advantages", None) is not None and bool(mask.any()):
            advantage = float(exp.advantages[i][mask].float().mean())
        info = getattr(exp, "info", None) or {}
        reward = _row_value(info["reward"], i) if "reward" in info else (
            _row_value(exp.rewards, i) if getattr(exp, "rewards", None) is not None else None)
        components = {k: _row_value(v, i) for k, v in info.items() if is_reward_component(k)}
        truncated = _row_value(exp.truncated, i) if getattr(exp, "truncated", None) is not None else None
        labels = getattr(exp, "labels", None) or []
        out.append(runs.rollout_sample_record(
            step, prompt=prompt, response=response, reward=reward,
            components={k: v for k, v in components.items() if v is not None},
            advantage=advantage if advantage is None or math.isfinite(advantage) else None,
            truncated=truncated, response_tokens=int(mask.sum()), label=labels[i] if i < len(labels) else None,
            turns=turns_of(exp, i, tokenizer)))
    return out


def record(trainer, experiences) -> None:
    """Write the step's sample (PPOTrainer process, run record open, flag not 0)."""
    writer = run_record.writer()
    step = run_record.current_step()
    cap = per_step_cap(trainer.args)
    if writer is None or step is None or cap <= 0 or writer.samples_full:
        return
    records = sample_records(step, experiences, trainer.tokenizer, cap)
    writer.write_samples(step, records, total_cap(trainer.args))


def make_compute_rollout_stats(original, module=None):
    @functools.wraps(original)
    def _compute_rollout_stats(self, experiences):
        stats = original(self, experiences)
        try:
            record(self, experiences)
        except Exception as exc:  # noqa: BLE001 - a sample we could not write must not stop training
            logger.warning("rlhf_ext: rollout samples of this step not recorded: %r", exc)
            run_record.add_event("rollout_samples_error", None, error=repr(exc)[:500])
        return stats

    return _compute_rollout_stats


def add_arguments(group) -> None:
    from rlhf_ext.ground.argtypes import non_negative_int, positive_int

    group.add_argument(
        "--rlhf_ext.rollout_samples", type=non_negative_int, default=runs.SAMPLES_PER_STEP, metavar="N",
        help=f"training rollouts kept per step in the run record's {runs.ROLLOUT_SAMPLES} (prompt, response, "
        "reward and its components, advantage, truncated; whole prompt groups in a fixed prompt order; "
        f"default {runs.SAMPLES_PER_STEP}, 0: off); 'rlhf-ext report' shows them",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.rollout_samples_total", type=positive_int, default=runs.SAMPLES_TOTAL, metavar="N",
        help=f"at most this many rollouts in {runs.ROLLOUT_SAMPLES} over the run (default {runs.SAMPLES_TOTAL})",
    )  # fmt: skip

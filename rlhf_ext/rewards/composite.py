"""Weighted sums of registered rewards, chosen by a spec string such as ``accuracy:1.0,format:0.2,truncation:-0.5``.

reward = sum_i weight_i * component_i. The batch is graded once (one :class:`MathGrader` pass) and
the verdicts are shared by every component that needs correctness (accuracy, length, cosine).
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import choice_rewards, rule_rewards  # noqa: F401  (registers the built-in rewards)
from .grader import GradeResult, MathGrader
from .registry import get_reward_entry
from .rule_rewards import completion_texts

logger = logging.getLogger(__name__)

REWARD_PRESETS: Dict[str, str] = {
    # The plain GSM8K/MATH recipe: correctness, a small bonus for stating a findable final answer,
    # a penalty for running out of tokens.
    "math": "accuracy:1.0,answer_format:0.2,truncation:-0.5",
    # Open-R1's default reward_funcs (accuracy, format, tag_count), weights 1.
    "open_r1": "accuracy:1.0,format:1.0,tag_count:1.0",
    # Choice and ranking answers (docs/rewards.md): the pick, or the order with partial credit, a
    # penalty for an answer that cannot be read and for running out of tokens.
    "choice": "choice_accuracy:1.0,parse_failure:-0.5,truncation:-0.5",
    "ranking": "ranking_partial:1.0,parse_failure:-0.5,truncation:-0.5",
}

# Keyword arguments the combination itself passes; options may not use these names.
_RESERVED = {"completions", "solution", "grades", "grader", "truncated", "completion_lengths", "completion_ids"}

FLAG_NAMES = ("no_answer", "gold_unparsed", "timeout", "grade_error", "truncated", "reward_error")


def parse_reward_spec(spec: str) -> List[Tuple[str, float]]:
    """``"accuracy:1.0,format:0.2,truncation:-0.5"`` (or a preset name) -> ``[(name, weight), ...]``.

    A name without ``:weight`` has weight 1. Unknown names raise :class:`UnknownRewardError`; empty
    specs, repeated names and weights that are not finite numbers raise ``ValueError``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"reward spec must be a non-empty string like 'accuracy:1.0,format:0.2', got {spec!r}")
    spec = spec.strip()
    if spec in REWARD_PRESETS:
        spec = REWARD_PRESETS[spec]
    out: List[Tuple[str, float]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty entry in reward spec {spec!r}")
        name, sep, weight_text = part.partition(":")
        name = name.strip()
        if sep:
            try:
                weight = float(weight_text.strip())
            except ValueError:
                raise ValueError(f"weight of {name!r} in reward spec {spec!r} is not a number: {weight_text!r}") from None
        else:
            weight = 1.0
        if not math.isfinite(weight):
            raise ValueError(f"weight of {name!r} in reward spec {spec!r} must be finite, got {weight_text!r}")
        if name in REWARD_PRESETS:
            raise ValueError(f"preset {name!r} cannot be weighted or combined with other entries; spell out "
                             f"{REWARD_PRESETS[name]!r} instead")
        get_reward_entry(name)  # raises UnknownRewardError listing the registered names
        if name in {n for n, _ in out}:
            raise ValueError(f"reward {name!r} appears twice in reward spec {spec!r}")
        out.append((name, weight))
    return out


@dataclass
class RewardBreakdown:
    """Everything a weighted reward computed for a batch.

    ``rewards``: the weighted sums. ``correct``: 1.0/0.0 per sample when the batch was graded, else
    None. ``components``: each reward's unweighted values. ``flags``: 1.0/0.0 per sample for
    ``no_answer`` (no final answer found), ``gold_unparsed``, ``timeout``, ``grade_error``,
    ``truncated``, ``reward_error`` (a component failed; its values are 0). ``grades``: the grader's
    verdicts, when graded.
    """

    rewards: List[float]
    correct: Optional[List[float]]
    components: Dict[str, List[float]] = field(default_factory=dict)
    flags: Dict[str, List[float]] = field(default_factory=dict)
    grades: Optional[List[GradeResult]] = None


class WeightedReward:
    """A weighted combination of registered rewards.

    ``spec``: ``"accuracy:1.0,format:0.2,truncation:-0.5"`` or a preset (``math``, ``open_r1``).
    ``options``: keyword options per reward, e.g. ``{"cosine": {"max_len": 2000}}``; checked here
    against each function's parameters and values.
    ``grader``: a :class:`MathGrader` to use; if None, one is created on first need with
    ``timeout``/``workers`` and closed by :meth:`close`.
    """

    def __init__(self, spec: str = "math", *, options: Optional[Mapping[str, Mapping]] = None,
                 grader: Optional[MathGrader] = None, timeout: float = 5.0, workers: Optional[int] = None):
        self.spec = spec
        self.weights = parse_reward_spec(spec)
        self.entries = [get_reward_entry(name) for name, _ in self.weights]
        self.options: Dict[str, Dict] = {}
        for name, opts in (options or {}).items():
            if name not in {n for n, _ in self.weights}:
                raise ValueError(f"options given for reward {name!r}, which is not in the reward spec {spec!r}")
            if not isinstance(opts, Mapping):
                raise ValueError(f"options for reward {name!r} must be a mapping, got {type(opts).__name__}")
            self.options[name] = dict(opts)
        for entry in self.entries:
            self._check_options(entry)
        self.uses_correctness = any(e.uses_correctness for e in self.entries)
        # every component's value depends on its own sample only: batches may be merged and split
        self.per_sample = all(e.per_sample for e in self.entries)
        if grader is None and self.uses_correctness:
            MathGrader(timeout=timeout, workers=workers).close()  # validate the arguments now, start nothing
        self._grader = grader
        self._owns_grader = grader is None
        self._timeout, self._workers = timeout, workers
        self._lock = threading.Lock()

    def _check_options(self, entry) -> None:
        opts = self.options.get(entry.name, {})
        params = inspect.signature(entry.fn).parameters
        named = {p for p, v in params.items() if v.kind in (v.KEYWORD_ONLY, v.POSITIONAL_OR_KEYWORD)} - _RESERVED
        for key in opts:
            if key in _RESERVED or key not in named:
                raise ValueError(f"unknown option {key!r} for reward {entry.name!r}; it takes: "
                                 f"{', '.join(sorted(named)) or '(no options)'}")
        try:  # a dry run on an empty batch checks the option values without grading anything
            entry.fn([], solution=[], grades=[], truncated=[], **opts)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"bad options for reward {entry.name!r}: {exc}") from None

    @property
    def grader(self) -> MathGrader:
        with self._lock:
            if self._grader is None or self._grader.closed:
                self._grader = MathGrader(timeout=self._timeout, workers=self._workers)
            return self._grader

    def close(self) -> None:
        if self._owns_grader and self._grader is not None:
            self._grader.close()

    def __enter__(self) -> "WeightedReward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WeightedReward({','.join(f'{n}:{w:g}' for n, w in self.weights)})"

    def __call__(self, completions: Sequence, solution: Optional[Sequence] = None, *,
                 truncated: Optional[Sequence[bool]] = None, completion_lengths: Optional[Sequence[int]] = None,
                 grades: Optional[Sequence[GradeResult]] = None) -> RewardBreakdown:
        """Score a batch. Raises only for malformed arguments (wrong types, mismatched lengths);
        a failing component or sample is scored 0 and flagged."""
        texts = completion_texts(completions)
        n = len(texts)
        for what, seq in (("solution", solution), ("truncated", truncated), ("completion_lengths", completion_lengths),
                          ("grades", grades)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"got {n} completions but {len(seq)} entries in {what}")
        flags = {name: [0.0] * n for name in FLAG_NAMES}
        if truncated is not None:
            flags["truncated"] = [1.0 if t else 0.0 for t in truncated]
        if grades is None and self.uses_correctness:
            if solution is None:
                raise ValueError(f"{self!r} needs gold answers: pass solution=[...]")
            # each gold by its answer type: choice/ranking golds here, math golds by the grader
            grades = choice_rewards.grade_mixed(texts, list(solution), lambda: self.grader) if n else []
        if grades is not None:
            grades = list(grades)
            for i, g in enumerate(grades):
                flags["no_answer"][i] = 1.0 if g.extracted is None else 0.0
                flags["gold_unparsed"][i] = 1.0 if not g.gold_parsed and not g.timeout else 0.0
                flags["timeout"][i] = 1.0 if g.timeout else 0.0
                flags["grade_error"][i] = 1.0 if g.error and not g.timeout and g.gold_parsed else 0.0
        rewards = [0.0] * n
        components: Dict[str, List[float]] = {}
        for (name, weight), entry in zip(self.weights, self.entries):
            try:
                values = entry.fn(texts, solution=solution, grades=grades, truncated=truncated,
                                  completion_lengths=completion_lengths, **self.options.get(name, {}))
                values = [float(v) for v in values]
                if len(values) != n or not all(math.isfinite(v) for v in values):
                    raise ValueError(f"returned {len(values)} values for {n} completions, or a non-finite value")
            except Exception as exc:  # a broken reward must not crash the training step
                logger.error("rlhf_ext reward %r failed on a batch of %d: %s: %s", name, n, type(exc).__name__, exc)
                values = [0.0] * n
                flags["reward_error"] = [1.0] * n
            components[name] = values
            rewards = [r + weight * v for r, v in zip(rewards, values)]
        correct = [1.0 if g.correct else 0.0 for g in grades] if grades is not None else None
        return RewardBreakdown(rewards=rewards, correct=correct, components=components, flags=flags, grades=grades)

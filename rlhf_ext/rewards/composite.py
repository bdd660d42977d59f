"""Weighted sums of registered rewards, chosen by a spec string such as ``accuracy:1.0,format:0.2,truncation:-0.5``.

reward = sum_i weight_i * component_i. The batch is graded once (one :class:`MathGrader` pass) and
the verdicts are shared by every component that needs correctness (accuracy, length, cosine).

:class:`WeightedReward` is the one place that scores: the host protocols (OpenRLHF's reward file and
server, an agent's ``step``, verl's ``compute_score``) only turn their inputs into its batches and its
:class:`RewardBreakdown` into their outputs. Several batches at once (OpenRLHF's per-sample calls) go
through :meth:`WeightedReward.score_many`, which grades them in one pass.
"""

from __future__ import annotations

import inspect
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

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

_NO_OPTIONS: Mapping[str, Any] = {}

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
        # score_one's plan: every reward has a one-sample form, and none has options
        self._one_plan = None
        if all(e.one is not None for e in self.entries) and not any(self.options.values()):
            self._one_plan = tuple((name, weight, e.one) for (name, weight), e in zip(self.weights, self.entries))
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
        return self._live_grader()

    def _live_grader(self) -> MathGrader:
        grader = self._grader  # the usual case, read without the lock that OpenRLHF's threads would queue on
        if grader is not None and not grader.closed:
            return grader
        with self._lock:
            if self._grader is None or self._grader.closed:
                self._grader = MathGrader(timeout=self._timeout, workers=self._workers)
            return self._grader

    def start(self, wait_ready: bool = True) -> "WeightedReward":
        """Start the grader's workers now rather than on the first batch (when the spec grades at all)."""
        if self.uses_correctness:
            self.grader.start(wait_ready=wait_ready)
        return self

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
        # OpenRLHF calls once per sample: a comprehension per flag, not an index store per flag and sample
        flags = {name: [0.0] * n for name in FLAG_NAMES}
        if truncated is not None:
            flags["truncated"] = [1.0 if t else 0.0 for t in truncated]
        if grades is None and self.uses_correctness:
            grades = self._grade_texts(texts, solution)
        if grades is not None:
            grades = list(grades)
            flags["no_answer"] = [1.0 if g.extracted is None else 0.0 for g in grades]
            flags["gold_unparsed"] = [1.0 if not g.gold_parsed and not g.timeout else 0.0 for g in grades]
            flags["timeout"] = [1.0 if g.timeout else 0.0 for g in grades]
            flags["grade_error"] = [1.0 if g.error and not g.timeout and g.gold_parsed else 0.0 for g in grades]
        rewards = [0.0] * n
        components: Dict[str, List[float]] = {}
        for (name, weight), entry in zip(self.weights, self.entries):
            try:
                values = entry.fn(texts, solution=solution, grades=grades, truncated=truncated,
                                  completion_lengths=completion_lengths, **self.options.get(name, _NO_OPTIONS))
                values = [float(v) for v in values]
                if len(values) != n or not all(map(math.isfinite, values)):
                    raise ValueError(f"returned {len(values)} values for {n} completions, or a non-finite value")
            except Exception as exc:  # a broken reward must not crash the training step
                logger.error("rlhf_ext reward %r failed on a batch of %d: %s: %s", name, n, type(exc).__name__, exc)
                values = [0.0] * n
                flags["reward_error"] = [1.0] * n
            components[name] = values
            rewards = [r + weight * v for r, v in zip(rewards, values)]
        correct = [1.0 if g.correct else 0.0 for g in grades] if grades is not None else None
        return RewardBreakdown(rewards=rewards, correct=correct, components=components, flags=flags, grades=grades)

    @property
    def scores_one(self) -> bool:
        """Whether :meth:`score_one` can score this spec (each reward has a one-sample form, no options)."""
        return self._one_plan is not None

    def score_one(self, text: str, gold: Any, truncated: Optional[bool] = None) -> RewardBreakdown:
        """``self([text], [gold], truncated=[truncated])`` (``truncated=None`` when None) for one sample,
        from each reward's one-sample form (:class:`~rlhf_ext.rewards.registry.RewardEntry`) instead of
        its list form: OpenRLHF calls the reward file once per sample, where the list forms' argument
        checks and the per-batch bookkeeping cost more than the rewards. Same values, flags and errors;
        ``ValueError`` when :attr:`scores_one` is False, ``TypeError`` for a text that is no string."""
        reward, correct, components, flags, grade = self.score_one_values(text, gold, truncated)
        return RewardBreakdown(rewards=[reward], correct=None if correct is None else [correct],
                               components={name: [v] for name, v in components.items()},
                               flags={name: [v] for name, v in flags.items()},
                               grades=None if grade is None else [grade])

    def score_one_values(self, text: str, gold: Any, truncated: Optional[bool] = None):
        """:meth:`score_one` as plain values, ``(reward, correct, components, flags, grade)``: floats, the
        correctness (None when not graded), ``{name: float}`` twice and the verdict (None when not graded)."""
        plan = self._one_plan
        if plan is None:
            raise ValueError(f"{self!r} has a reward without a one-sample form, or options: score a batch")
        if not isinstance(text, str):
            raise TypeError(f"score_one takes the completion as a str, got {type(text).__name__}")
        cut = 1.0 if truncated else 0.0
        grade = None
        if self.uses_correctness:
            grade = choice_rewards.grade_one_mixed(text, gold, self._live_grader)
            flags = {"no_answer": 1.0 if grade.extracted is None else 0.0,
                     "gold_unparsed": 1.0 if not grade.gold_parsed and not grade.timeout else 0.0,
                     "timeout": 1.0 if grade.timeout else 0.0,
                     "grade_error": 1.0 if grade.error and not grade.timeout and grade.gold_parsed else 0.0,
                     "truncated": cut, "reward_error": 0.0}
        else:
            flags = {"no_answer": 0.0, "gold_unparsed": 0.0, "timeout": 0.0, "grade_error": 0.0,
                     "truncated": cut, "reward_error": 0.0}
        reward = 0.0
        components: Dict[str, float] = {}
        for name, weight, one in plan:
            try:
                value = float(one(text, grade, truncated))
                if not math.isfinite(value):
                    raise ValueError("returned 1 values for 1 completions, or a non-finite value")
            except Exception as exc:  # as __call__: a broken reward must not crash the training step
                logger.error("rlhf_ext reward %r failed on a batch of %d: %s: %s", name, 1, type(exc).__name__, exc)
                value = 0.0
                flags["reward_error"] = 1.0
            components[name] = value
            reward = reward + weight * value
        return reward, None if grade is None else (1.0 if grade.correct else 0.0), components, flags, grade

    def grade(self, completions: Sequence, solution: Optional[Sequence]) -> List[GradeResult]:
        """The verdicts on a batch, each gold by its answer type: choice and ranking golds here, math golds
        by the grader's workers. Raises ``ValueError`` without golds."""
        if solution is None:
            raise ValueError(f"{self!r} needs gold answers: pass solution=[...]")
        return self._grade_texts(completion_texts(completions), solution)

    def _grade_texts(self, texts: List[str], solution: Optional[Sequence]) -> List[GradeResult]:
        """:meth:`grade` for texts already taken out of their completions."""
        if solution is None:
            raise ValueError(f"{self!r} needs gold answers: pass solution=[...]")
        return choice_rewards.grade_mixed(texts, list(solution), self._live_grader) if texts else []

    def score_many(self, batches: Sequence[Mapping[str, Any]]) -> List[Union[RewardBreakdown, Exception]]:
        """Score several batches at once: for each, what ``self(**batch)`` returns, or the exception it
        raised in its place (as ``asyncio.gather(..., return_exceptions=True)`` does), so that a malformed
        batch costs only itself.

        Every batch's samples are graded in ONE pass (the grader's workers get them a batch at a time).
        When every component is per-sample (:attr:`per_sample`), the batches are also scored as one and
        the breakdown split (a failure then answers each of them); otherwise each batch is scored alone
        with its share of the verdicts, so batch-relative rewards (``length``) keep their per-batch
        meaning, and if grading them together fails each batch grades its own.
        """
        batches = [dict(b) for b in batches]
        if not batches:
            return []
        if self.per_sample:
            merged = _merge_batches(batches)
            if merged is not None:
                try:
                    whole = self(**merged)
                except Exception as exc:
                    return [exc for _ in batches]
                return _split_breakdown(whole, [len(b["completions"]) for b in batches])
        shares: List[Optional[Tuple[int, int]]] = [None] * len(batches)  # each batch's slice of the verdicts
        grades = None
        if self.uses_correctness:
            texts: List[str] = []
            golds: List = []
            for i, b in enumerate(batches):
                if b.get("grades") is not None or b.get("solution") is None:
                    continue  # it has its verdicts, or its call reports the missing golds
                try:
                    batch_texts = completion_texts(b["completions"])
                    batch_golds = list(b["solution"])
                except Exception:
                    continue  # malformed: scored alone below, where it raises its own error
                if len(batch_golds) != len(batch_texts):
                    continue
                shares[i] = (len(texts), len(texts) + len(batch_texts))
                texts.extend(batch_texts)
                golds.extend(batch_golds)
            if texts:
                try:
                    grades = self.grade(texts, golds)
                except Exception as exc:  # each batch then grades its own samples (and reports a failure)
                    logger.warning("rlhf_ext reward: grading %d samples together failed (%s); grading per batch",
                                   len(texts), exc)
        out: List[Union[RewardBreakdown, Exception]] = []
        for b, share in zip(batches, shares):
            if grades is not None and share is not None:
                b["grades"] = grades[share[0]:share[1]]
            try:
                out.append(self(**b))
            except Exception as exc:
                out.append(exc)
        return out


_BATCH_KEYS = ("completions", "solution", "truncated", "completion_lengths")


def _merge_batches(batches: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The batches as one (each argument's lists joined), or None when they cannot be (an argument some
    give and others do not, verdicts given, an unknown key): they are then scored one by one."""
    if any(set(b) - set(_BATCH_KEYS) for b in batches):
        return None
    merged: Dict[str, Any] = {}
    for key in _BATCH_KEYS:
        values = [b.get(key) for b in batches]
        if all(v is None for v in values) and key != "completions":
            merged[key] = None
        elif any(v is None for v in values):
            return None
        else:
            try:
                if any(len(v) != len(b["completions"]) for v, b in zip(values, batches)):
                    return None
                merged[key] = [x for v in values for x in v]
            except TypeError:
                return None
    return merged


def _split_breakdown(whole: RewardBreakdown, sizes: Sequence[int]) -> List[RewardBreakdown]:
    out, lo = [], 0
    for size in sizes:
        hi = lo + size
        out.append(RewardBreakdown(
            rewards=whole.rewards[lo:hi], correct=None if whole.correct is None else whole.correct[lo:hi],
            components={k: v[lo:hi] for k, v in whole.components.items()},
            flags={k: v[lo:hi] for k, v in whole.flags.items()},
            grades=None if whole.grades is None else whole.grades[lo:hi]))
        lo = hi
    return out

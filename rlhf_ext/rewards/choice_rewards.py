"""Rewards for choice and ranking answers, and grading a batch whose golds mix answer types.

A gold is graded by its type (:mod:`.choice`): a choice/ranking gold (a mapping or its JSON text
with ``options`` and ``answer``) by :func:`~.choice.grade_structured`, in this thread (pure string
work, microseconds); any other gold by :class:`~rlhf_ext.rewards.MathGrader`. Each reward below
reads the verdicts (``grades``) that a weighted combination computes once per batch, so
``choice_accuracy:1.0,ranking_partial:0.5,parse_failure:-0.5,format:0.1,truncation:-0.5`` grades
each sample once.

On a gold of another type each reward keeps its meaning where it has one: a choice is a ranking of
one pick (``ranking_exact`` and ``ranking_partial`` are its correctness), a ranking's pick is its first
place (``choice_accuracy`` is its top-1 accuracy), a math gold has only correctness.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from .choice import ChoiceGrade, grade_any_structured
from .registry import register_reward
from .rule_rewards import check_finite, completion_texts, supplied_grades


def grade_mixed(texts: Sequence[str], golds: Sequence, math_grader: Optional[Callable[[], object]] = None,
                require_anchor: bool = True) -> list:
    """One verdict per text: a :class:`~.choice.ChoiceGrade` for a choice/ranking gold, a
    :class:`~rlhf_ext.rewards.GradeResult` (one ``grade_batch`` over all of them, from
    ``math_grader()`` or the default grader) for the rest. Never raises for a text or a gold."""
    if len(texts) != len(golds):
        raise ValueError(f"got {len(texts)} completions but {len(golds)} solutions")
    out: list = [None] * len(texts)
    math_idx = []
    for i, (text, gold) in enumerate(zip(texts, golds)):
        g = grade_any_structured(text, gold, require_anchor=require_anchor)
        if g is None:
            math_idx.append(i)
        else:
            out[i] = g
    if math_idx:
        if math_grader is None:
            from .grader import default_grader

            grader = default_grader()
        else:
            grader = math_grader()
        for i, g in zip(math_idx, grader.grade_batch([texts[i] for i in math_idx], [golds[i] for i in math_idx])):
            out[i] = g
    return out


def grade_one_mixed(text: str, gold, math_grader: Callable[[], object], require_anchor: bool = True):
    """:func:`grade_mixed` of one sample, without its lists: the verdict :func:`grade_mixed` gives it
    (``math_grader().grade`` answers a plain-number sample itself, without a future)."""
    g = grade_any_structured(text, gold, require_anchor=require_anchor)
    return g if g is not None else math_grader().grade(text, gold)


def _grades(name: str, texts: List[str], solution, grades, grader) -> list:
    supplied = supplied_grades(name, texts, solution, grades)
    if supplied is not None:
        return supplied
    return grade_mixed(texts, list(solution), None if grader is None else (lambda: grader))


def parse_failed(g) -> bool:
    """The response states no answer that could be read (unparseable, ambiguous or invalid), against a
    gold that could: the model's failure, not the data's."""
    if isinstance(g, ChoiceGrade):
        return g.parse_failed
    return g.extracted is None and g.gold_parsed and not g.timeout


def _choice_accuracy_one(text, g, truncated) -> float:
    return 1.0 if (g.top1 if isinstance(g, ChoiceGrade) else g.correct) else 0.0


@register_reward("choice_accuracy", uses_correctness=True, per_sample=True, one=_choice_accuracy_one)
def choice_accuracy_reward(completions, solution=None, *, grades=None, grader=None, **kwargs) -> List[float]:
    """1.0 when the pick is the gold's (a ranking's pick: its first place), else 0.0."""
    texts = completion_texts(completions)
    return [_choice_accuracy_one(None, g, None) for g in _grades("choice_accuracy", texts, solution, grades, grader)]


def _ranking_exact_one(text, g, truncated) -> float:
    return 1.0 if g.correct else 0.0


@register_reward("ranking_exact", uses_correctness=True, per_sample=True, one=_ranking_exact_one)
def ranking_exact_reward(completions, solution=None, *, grades=None, grader=None, **kwargs) -> List[float]:
    """1.0 when the whole order is the gold's (full-ranking accuracy), else 0.0."""
    texts = completion_texts(completions)
    return [_ranking_exact_one(None, g, None) for g in _grades("ranking_exact", texts, solution, grades, grader)]


@register_reward("ranking_partial", uses_correctness=True, per_sample=True)
def ranking_partial_reward(completions, solution=None, *, grades=None, grader=None, top1_weight: float = 0.5,
                           **kwargs) -> List[float]:
    """``(1 - w) * (1 + tau) / 2 + w * top1`` for a parsed ranking (Kendall's tau against the gold,
    :func:`~.choice.ranking_partial_score`), 0.0 for one that could not be parsed; ``w = top1_weight``."""
    check_finite("ranking_partial", top1_weight=top1_weight)
    if not 0.0 <= top1_weight <= 1.0:
        raise ValueError(f"ranking_partial: top1_weight must be in [0, 1], got {top1_weight!r}")
    texts = completion_texts(completions)
    out = []
    for g in _grades("ranking_partial", texts, solution, grades, grader):
        if isinstance(g, ChoiceGrade) and g.answer_type == "ranking" and g.tau is not None:
            out.append((1.0 - top1_weight) * (1.0 + g.tau) / 2.0 + top1_weight * (1.0 if g.top1 else 0.0))
        else:
            out.append(1.0 if g.correct else 0.0)
    return out


def _parse_failure_one(text, g, truncated) -> float:
    return 1.0 if parse_failed(g) else 0.0


@register_reward("parse_failure", uses_correctness=True, per_sample=True, one=_parse_failure_one)
def parse_failure_reward(completions, solution=None, *, grades=None, grader=None, **kwargs) -> List[float]:
    """1.0 when the final answer cannot be read (no answer, ambiguous, a label not among the options, a
    ranking that repeats or misses a candidate), else 0.0; weight it negatively (``parse_failure:-0.5``).
    A truncated response that states nothing counts too: weight ``truncation`` for the cut itself."""
    texts = completion_texts(completions)
    return [_parse_failure_one(None, g, None) for g in _grades("parse_failure", texts, solution, grades, grader)]

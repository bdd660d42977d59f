"""Find the final answer in model text and in dataset golds; normalize it into a vote key.

Pure string work, linear in the length of the text, with nothing evaluated: safe to run on hostile
model output in any thread. The grader hands the *raw* candidate found here to math-verify; the
*normalized* form is the majority-vote key that :class:`~rlhf_ext.rewards.GradeResult` reports as
``extracted``. The entry points are here (:func:`extract_answer`, :func:`prepare_gold`); the work is
done in three modules, whose names this module re-exports:

* :mod:`.answer_finding`: where the final answer is (``<answer>`` tags, boxes, answer phrases,
  GSM8K's ``####``, the last expression when no anchor is required), :func:`find_answer_candidate`;
* :mod:`.answer_spelling`: the LaTeX math-verify reads wrongly, rewritten before it parses
  (:func:`latex_for_math_verify`, the two readings of a decimal comma :func:`answer_readings`);
* :mod:`.answer_normalization`: an answer as written -> its vote key (:func:`normalize_answer`).

Golds (:func:`prepare_gold`) may be GSM8K solutions (``... #### 18``), full MATH solutions with a
``\\boxed{}``, bare answers (``\\frac{1}{2}``, ``"025"``), or numbers from JSON (``27.0``).
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal
from typing import Optional

from .answer_finding import (ANSWER_PHRASE, MAX_ANSWER_CHARS, AnswerCandidate, clear_search_memo,
                             find_answer_candidate, find_final_boxes, find_gold_boxes, find_last_boxed,
                             find_last_expression, join_boxes, last_answer_tag, strip_math_delimiters)
from .answer_normalization import THOUSANDS, normalize_answer
from .answer_spelling import (answer_readings, answer_spelling, brace_operator_arguments, decimal_comma,
                              join_digit_groups, latex_for_math_verify, strip_number_unit)

__all__ = [
    "ANSWER_PHRASE", "MAX_ANSWER_CHARS", "AnswerCandidate", "answer_readings", "answer_spelling",
    "brace_operator_arguments", "clear_caches", "decimal_comma", "extract_answer", "find_answer_candidate",
    "find_final_boxes", "find_gold_boxes", "find_last_boxed", "find_last_expression", "join_boxes", "join_digit_groups",
    "last_answer_tag", "latex_for_math_verify", "normalize_answer", "prepare_gold", "strip_math_delimiters",
    "strip_number_unit",
]


def extract_answer(text: str, require_anchor: bool = True) -> Optional[str]:
    """The normalized final answer of ``text`` (a majority-vote key), or None when it states none.

    Same rules as the grader uses (``require_anchor`` as :class:`~rlhf_ext.rewards.MathGrader`'s);
    no math-verify, no evaluation, linear time.
    """
    candidate = find_answer_candidate(text, require_anchor=require_anchor)
    if candidate is None:
        return None
    key = normalize_answer(candidate.raw)
    return key or None


# --- golds -------------------------------------------------------------------------------------


def prepare_gold(gold) -> Optional[str]:
    """The answer part of a dataset gold, as a string for math-verify; None when there is none.

    ``"... #### 1,234"`` (GSM8K) -> ``"1234"``; a solution with ``\\boxed{}`` -> the last boxed
    content; ``27.0`` (AMC, a JSON number) -> ``"27.0"``; ``"$\\frac12$"`` -> ``"\\frac12"``.
    Booleans, None, NaN and blank strings have no answer.
    """
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return str(gold)
    if isinstance(gold, float):
        if not math.isfinite(gold):
            return None
        text = repr(gold)
        if "e" in text:  # positional notation: math-verify cannot read repr's "1e+20"
            text = format(Decimal(text), "f")
        return text
    if not isinstance(gold, str):
        return None
    return _prepare_gold_text(gold)


@functools.lru_cache(maxsize=2048)
def _prepare_gold_text(gold: str) -> Optional[str]:
    # a GRPO group's samples share their label: its answer is found once
    text = gold.strip()
    if not text:
        return None
    if "####" in text:
        value = text[text.rfind("####") + 4 :].strip().split("\n", 1)[0].strip()
        value = value.strip("$").strip()
        if THOUSANDS.match(value):
            value = value.replace(",", "")
        return value or None
    boxes = find_gold_boxes(text)
    if boxes:
        text = join_boxes(boxes)
    text = strip_math_delimiters(text)
    return text or None


def clear_caches() -> None:
    """Forget every prepared gold and every answer search remembered (a benchmark's cold start)."""
    _prepare_gold_text.cache_clear()
    clear_search_memo()

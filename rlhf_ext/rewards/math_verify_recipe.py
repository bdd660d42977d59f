"""How a response is graded against a gold with math-verify: the exact calls, in one place.

Open-R1's ``accuracy_reward`` (huggingface/open-r1, ``src/open_r1/rewards.py``) is the model:

* the answer is parsed with LaTeX extraction only, Open-R1's normalization (``nits=False,
  malformed_operators=False, basic_latex=True, boxed="all", units=True``), ``boxed_match_priority=0``,
  ``try_extract_without_anchor=False``, ``extraction_mode="first_match"``;
* the gold is parsed with math-verify's default LaTeX extraction, ``extraction_mode="first_match"``;
* ``verify(gold, answer)``: gold first (verify is not symmetric).

Deliberate differences, each for a reason:

* math-verify sees the final answer found by :mod:`~rlhf_ext.rewards.extraction` wrapped as
  ``\\boxed{...}``, not the whole response. So the boxes of the final answer count, as a set (the
  last box and those just before it that only separators divide from it: ``\\boxed{2} and
  \\boxed{5}``); math-verify's ``boxed="all"`` would join every boxed expression of the response,
  an earlier try included. ``<answer>`` tags, "The answer is 42" and ``#### 42`` answers are graded
  (Open-R1 finds no answer in them). With ``require_anchor=False`` (evaluation) a response without
  any of these is graded on its last math expression, found by the extraction too (math-verify's
  ``try_extract_without_anchor``, without its ``ExprExtractionConfig``).
* Golds go through :func:`~rlhf_ext.rewards.extraction.prepare_gold` (GSM8K ``####``, a solution's
  last ``\\boxed{}``, JSON numbers) and are parsed as ``\\boxed{gold}``; Open-R1 expects LaTeX golds.
* No ``ExprExtractionConfig`` anywhere: it runs sympy's ``parse_expr`` (an ``eval``) on the matched
  text. LaTeX extraction goes through latex2sympy's ANTLR parser, which evaluates nothing.
* Both the answer and the gold go through
  :func:`~rlhf_ext.rewards.extraction.latex_for_math_verify` first, for spellings math-verify
  misreads (also ``1 000``, a unit after a lone number ``7.5 m^2``; and a decimal comma ``2,74`` is
  tried as 2.74 and as the pair math-verify reads, :func:`~rlhf_ext.rewards.extraction.answer_readings`): ``1\\,000`` / ``1{,}000`` / ``1~000`` (read as products: ``1\\,000`` equals 0 and not
  1000) become ``1000``, and unbraced operator arguments get braces as TeX reads them
  (``\\frac12``, ``2\\sqrt3``, ``\\frac{\\sqrt3}{2}``: Open-R1's ``malformed_operators=False``
  answer normalization never matches them; math-verify's own ``malformed_operators=True`` fix
  reads ``\\frac123`` as ``\\frac{1}{23}`` and rewrites every ``a/b``, so it stays off).
* ``equations=True`` is left out of the normalization: math-verify 0.9 deprecated it (the parser
  handles equations itself) and warns on every call.

math-verify's own timeouts stay at their defaults (``parsing_timeout=5``, ``timeout_seconds=5``):
they use SIGALRM, which works in the main thread of a grader worker process, so a sample that
math-verify can interrupt gets exactly math-verify's verdict. The grader's hard per-sample limit
(killing the worker) covers what SIGALRM cannot interrupt.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from latex2sympy2_extended import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify

from .answer_forms import rounding_digits
from .extraction import answer_readings, find_answer_candidate, normalize_answer, prepare_gold

ANSWER_EXTRACTION = [
    LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            nits=False,
            malformed_operators=False,
            basic_latex=True,
            boxed="all",
            units=True,
        ),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
]
GOLD_EXTRACTION = [LatexExtractionConfig()]


def parse_gold(gold_text: str) -> List:
    """math-verify's parse of a prepared gold (see :func:`prepare_gold`), one per reading of it (see
    :func:`~rlhf_ext.rewards.extraction.answer_readings`); readings that fail to parse are left out,
    so an empty list means the gold cannot be read."""
    parsed = []
    for reading in answer_readings(gold_text, gold=True):
        p = parse("\\boxed{" + reading + "}", extraction_config=GOLD_EXTRACTION, extraction_mode="first_match")
        if p:
            parsed.append(p)
    return parsed


def parse_answer(raw_answer: str) -> List:
    """math-verify's parses of a final answer as written in the response, one per reading."""
    return [parse("\\boxed{" + reading + "}", extraction_config=ANSWER_EXTRACTION, extraction_mode="first_match")
            for reading in answer_readings(raw_answer)]


def verify_readings(golds: List, answers: List, rounding: Optional[int] = None) -> bool:
    """Whether some reading of the answer equals some reading of the gold (``verify(gold, answer)``);
    ``rounding``: also compared at that many decimals (:func:`~rlhf_ext.rewards.answer_forms.rounding_digits`)."""
    # allow_set_relation_comp: an inequality answer against the interval gold it denotes (math-verify
    # compares the other direction, gold inequality against an interval answer, without it)
    if any(verify(gold, answer, allow_set_relation_comp=True) for gold in golds for answer in answers):
        return True
    return rounding is not None and any(verify(gold, answer, float_rounding=rounding, allow_set_relation_comp=True)
                                        for gold in golds for answer in answers)


def grade_response(response: str, gold_text: Optional[str], gold_cache: Optional[Dict[str, List]] = None,
                   on_gold_parsed=None, verdict_cache: Optional[Dict] = None, before_answer=None,
                   require_anchor: bool = True) -> Dict:
    """Grade one response in this thread: ``{"correct", "extracted", "gold_parsed"}``.

    ``gold_text`` is :func:`prepare_gold`'s output. ``gold_cache`` maps it to its parse, so a gold is
    parsed once per process; ``verdict_cache`` maps (gold, answer as written) to the verdict, so the
    same final answer to the same problem (common among a GRPO group's samples) is verified once. ``on_gold_parsed()`` is called after a gold was parsed anew (the grader
    uses it to learn which phase a sample that overran its time limit was in). ``before_answer(response)``
    runs after the gold is parsed and before the answer is (the grader's slow-parse test hook).
    ``require_anchor``: as :class:`~rlhf_ext.rewards.MathGrader`'s (False: a response without an
    anchor is graded on its last math expression).
    Must run in a main thread unless math-verify's timeouts are off: they use SIGALRM.
    """
    candidate = find_answer_candidate(response, require_anchor=require_anchor)
    extracted = normalize_answer(candidate.raw) or None if candidate is not None else None
    if gold_text is None:
        return {"correct": False, "extracted": extracted, "gold_parsed": False}
    gold = gold_cache.get(gold_text) if gold_cache is not None else None
    if gold is None:
        gold = parse_gold(gold_text)
        if gold_cache is not None:
            gold_cache[gold_text] = gold
        if on_gold_parsed is not None:
            on_gold_parsed()
    if not gold:
        return {"correct": False, "extracted": extracted, "gold_parsed": False}
    if candidate is None:
        return {"correct": False, "extracted": None, "gold_parsed": True}
    if before_answer is not None:
        before_answer(response)
    key = (gold_text, candidate.raw)
    correct = verdict_cache.get(key) if verdict_cache is not None else None
    if correct is None:
        correct = verify_readings(gold, parse_answer(candidate.raw), rounding_digits(candidate.raw))
        if verdict_cache is not None:
            verdict_cache[key] = correct
    return {"correct": correct, "extracted": extracted, "gold_parsed": True}


__all__ = ["ANSWER_EXTRACTION", "GOLD_EXTRACTION", "parse_gold", "parse_answer", "verify_readings", "grade_response",
           "prepare_gold"]

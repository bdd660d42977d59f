"""Issue 41, item 3: the fast path decides intervals and unions of intervals with exact endpoints
(:mod:`rlhf_ext.rewards.exact_intervals`) as math-verify does, comparing them as sets of reals.

Each hand-checked pair against the full grader (the worker's code, ``grade_response``, in this thread) and
real math-verify as the grader calls it, in reward mode (``\\boxed{}``) and in evaluation mode (no anchor).
"""

import logging

import pytest

from rlhf_ext.rewards import prepare_gold
from rlhf_ext.rewards.exact_numbers import _set_element, exact_verdict, gold_value
from rlhf_ext.rewards.exact_intervals import ExactIntervals, exact_intervals
from rlhf_ext.rewards.math_verify_recipe import grade_response

logging.getLogger("math_verify").setLevel(logging.ERROR)

# (answer, gold, math-verify's verdict): equal spellings, the sympy rules (an infinite end is open, pieces
# merge where they overlap or touch at a closed end, an empty piece is nothing) and near misses
HAND = [
    ("(2,\\infty)", "(2,\\infty)", True), ("(2, +\\infty)", "(2,\\infty)", True),
    ("\\left(2,\\infty\\right)", "(2,\\infty)", True), ("(2,\\infty]", "(2,\\infty)", True),
    ("[2,\\infty)", "(2,\\infty)", False), ("(3,\\infty)", "(2,\\infty)", False), ("(2,5)", "(2,\\infty)", False),
    ("(9,36)\\cup(0,9)", "(0,9) \\cup (9,36)", True), ("(0,9) \\cup (9,37)", "(0,9) \\cup (9,36)", False),
    ("(0,36)", "(0,9) \\cup (9,36)", False), ("(0,9)\\cup(9,36)\\cup(36,40)", "(0,9) \\cup (9,36)", False),
    ("(0,9]\\cup(9,36)", "[0,36)", False), ("(0,9]\\cup[9,36)", "(0,36]", False),
    ("[1,2]\\cup[2,3]", "[1,3]", True), ("[1,2)\\cup(2,3]", "[1,3]", False), ("[1,3]", "[1,2]", False),
    ("(1,2]", "[1,2]", False),
    ("(-\\infty,\\frac{1}{2}]", "(-\\infty,\\frac12]", True), ("(-\\infty,\\frac{1}{3}]", "(-\\infty,\\frac12]", False),
    ("[-\\sqrt{2},\\sqrt{2}]", "[-\\sqrt2,\\sqrt2]", True), ("[-\\sqrt{3},\\sqrt{2}]", "[-\\sqrt2,\\sqrt2]", False),
    ("(-\\infty, 1)\\cup(1,\\infty)", "(-\\infty,1)\\cup(1,\\infty)", True),
    ("(1,\\infty)\\cup(-\\infty,1)", "(-\\infty,1)\\cup(1,\\infty)", True),
    ("(-\\infty,\\infty)", "(-\\infty,1)\\cup(1,\\infty)", False),
    ("[0, 2\\pi)", "[0,2\\pi)", True), ("[0, \\pi)", "[0,2\\pi)", False),
]


def _verdicts(answer: str, gold: str):
    gold_text = prepare_gold(gold)
    response = "So the final answer is $\\boxed{%s}$." % answer
    plain = "We solve the inequality and get $%s$" % answer
    return (exact_verdict(response, gold_text), grade_response(response, gold_text, {}),
            exact_verdict(plain, gold_text, require_anchor=False),
            grade_response(plain, gold_text, {}, require_anchor=False))


@pytest.mark.parametrize("answer, gold, correct", HAND)
def test_interval_verdicts_equal_the_full_path_and_math_verify(answer, gold, correct):
    quick, full, quick_eval, full_eval = _verdicts(answer, gold)
    assert full["correct"] is correct  # the worker's verdict: math-verify's, as the grader calls it
    assert quick is not None and quick["correct"] is correct, quick
    assert quick["correct"] == full["correct"] and quick["gold_parsed"] is True
    assert quick_eval is not None and quick_eval["correct"] == full_eval["correct"]


# left to the workers: forms math-verify reads another way (a tuple, a point set, an inequality) or
# with its numeric tolerance (decimals)
UNDECIDED = [  # ("((2,\\infty))+1": decided wrong since, tests/test_rewards_exact_near_misses.py)
    ("x>2", "(2,\\infty)"), ("(5,2)", "(2,\\infty)"),
    ("(5,\\infty)\\cup\\{3\\}", "(5,\\infty)"), ("\\mathbb{R}", "(-\\infty,\\infty)"), ("[0,0.5]", "[0,\\frac12]"),
    ("(2,\\infty)", "x>2"), ("[2,1]", "[1,2]"), ("[2,1]", "[2,0]"), ("[1,1]\\cup(2,3)", "[1,3]"),
]


@pytest.mark.parametrize("answer, gold", UNDECIDED)
def test_what_the_fast_path_leaves_to_the_workers(answer, gold):
    quick, full, _, _ = _verdicts(answer, gold)
    assert quick is None, quick
    assert isinstance(full["correct"], bool)


def test_the_sets_by_hand():
    read = lambda text, gold=True: exact_intervals(text, _set_element, gold=gold)  # noqa: E731
    merged = read("[40,41]\\cup(0,9]\\cup[9,36)")
    assert isinstance(merged, ExactIntervals) and len(merged.pieces) == 2  # (0,36) and [40,41]
    (lo, lo_closed, hi, hi_closed), (lo2, lo2_closed, hi2, hi2_closed) = merged.pieces
    assert (lo[0], lo_closed, hi[0], hi_closed) == (0, False, 36, False)
    assert (lo2[0], lo2_closed, hi2[0], hi2_closed) == (40, True, 41, True)
    assert read("(1,2)") is None and read("(1,2)", gold=False) is not None  # a gold pair is exact_tuple's
    assert read("(2,1)", gold=False) is None and read("(1,1)\\cup(2,3)") is None  # not increasing: no set
    assert read("[1,2,3]") is None and read("(1,\\infty") is None and read("(\\infty,1)") is None
    assert isinstance(gold_value(prepare_gold("(0,9) \\cup (9,36)")), ExactIntervals)
    assert isinstance(gold_value(prepare_gold("(1,2)")), tuple)  # still the tuple reading


def _union(draw, st):
    pieces = []
    for _ in range(draw(st.integers(1, 3))):
        lo = draw(st.one_of(st.just("-\\infty"), st.integers(-4, 4).map(str)))
        hi = draw(st.one_of(st.just("\\infty"), st.integers(-4, 4).map(str), st.just("\\frac{1}{2}")))
        pieces.append(draw(st.sampled_from("[(")) + lo + "," + hi + draw(st.sampled_from("])")))
    return "\\cup".join(pieces)


def test_random_unions_decided_equal_the_full_path():
    """Random unions of up to three pieces with small endpoints, brackets of every kind, infinite ends and
    touching or overlapping pieces: wherever the fast path decides, it says what the worker says."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    decided = []

    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        gold, answer = _union(data.draw, st), _union(data.draw, st)
        if data.draw(st.booleans()):
            answer = gold.replace(",", ", ")
        response = "So the final answer is $\\boxed{%s}$." % answer
        quick = exact_verdict(response, prepare_gold(gold))
        if quick is not None:
            full = grade_response(response, prepare_gold(gold), {})
            assert quick["correct"] == full["correct"], (answer, gold, quick, full)
            decided.append(quick["correct"])

    check()
    assert decided.count(True) >= 10 and decided.count(False) >= 10, decided  # both verdicts exercised

"""Issue 41, item 3: the fast path reads mixed numbers (``137 \\frac{1}{2}``) and digit groups separated by
LaTeX spaces (``10,\\!080``) as math-verify does (:mod:`rlhf_ext.rewards.exact_mixed`): each case against the
full grader (the worker's code, ``grade_response``) and real math-verify, in reward and evaluation mode."""

import logging

import pytest

from rlhf_ext.rewards import prepare_gold
from rlhf_ext.rewards.exact_mixed import mixed_number, ungrouped
from rlhf_ext.rewards.exact_numbers import exact_verdict
from rlhf_ext.rewards.math_verify_recipe import grade_response

logging.getLogger("math_verify").setLevel(logging.ERROR)

# (answer, gold, math-verify's verdict)
DECIDED = [
    ("137 \\frac{1}{2}", "\\frac{275}{2}", True), ("137\\frac12", "137 \\frac{1}{2}", True),
    ("137\\tfrac{1}{2}", "137 \\frac{1}{2}", True), ("137.5", "137 \\frac{1}{2}", True),
    ("\\frac{275}{2}", "137 \\frac{1}{2}", True), ("68.5", "137 \\frac{1}{2}", False),  # not a product
    ("137", "137 \\frac{1}{2}", False), ("1\\frac{4}{6}", "1\\frac{4}{5}", False), ("1.8", "1\\frac45", True),
    ("-1\\frac{1}{2}", "-\\frac32", True), ("2\\frac{3}{2}", "3.5", True), ("2\\frac{1}{2}", "5", False),
    ("10,\\!080", "10080", True), ("10080", "10,\\!080", True), ("10,080", "10,\\!080", True),
    ("10\\,080", "10,\\!080", True), ("1,\\!000,\\!000", "1000000", True), ("10,\\!081", "10,\\!080", False),
]
UNDECIDED = [  # a zero denominator, a letter after it, groups not of three (arithmetic: test_rewards_exact_near_misses)
    ("3\\frac{1}{0}", "3"), ("1\\frac{4}{5}x", "1.8"),
    ("10,\\!08", "10,\\!080"), ("1,\\!0800", "10,\\!080"),
]


def both_modes(answer, gold):
    """(fast path, full grader) verdicts in reward mode, then in evaluation mode (no anchor)."""
    gold_text = prepare_gold(gold)
    for response, kwargs in (("So the answer is $\\boxed{%s}$." % answer, {}),
                             ("We get $%s$" % answer, {"require_anchor": False})):
        yield exact_verdict(response, gold_text, **kwargs), grade_response(response, gold_text, {}, **kwargs)


@pytest.mark.parametrize("answer, gold, correct", DECIDED)
def test_decided_verdicts_equal_the_full_path_and_math_verify(answer, gold, correct):
    for quick, full in both_modes(answer, gold):
        assert full["correct"] is correct
        assert quick is not None and quick["correct"] is correct, quick


@pytest.mark.parametrize("answer, gold", UNDECIDED)
def test_left_to_the_workers(answer, gold):
    for quick, full in both_modes(answer, gold):
        assert quick is None, quick
        assert full["correct"] is False


def test_the_readers_by_hand():
    from fractions import Fraction

    assert mixed_number("-1\\frac{1}{2}") == ("rational", Fraction(-3, 2))
    assert mixed_number("2\\dfrac{3}{3}") == ("int", Fraction(3))
    assert mixed_number("2\\frac{1}{0}") is None and mixed_number("\\frac{1}{2}") is None
    assert ungrouped("1,\\!000,\\!000") == "1,000,000" and ungrouped("10\\,080") == "10,080"
    assert ungrouped("10,\\!08") is None and ungrouped("010,\\!080") is None

"""Issue 41, item 3: the near miss ``(A)+N`` decided by the fast path (:mod:`rlhf_ext.rewards.exact_near_misses`)
exactly as the full grader (the worker's code, ``grade_response``, which calls real math-verify) decides it, in
reward and evaluation mode: a structure plus a number is wrong, a degree, mixed-number or dollar spelling plus
a number is that number; what is left to the workers stays left."""

import logging
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhf_ext.rewards.exact_near_misses import number_plus_number, split_plus_number
from rlhf_ext.rewards.exact_numbers import exact_number

from test_rewards_exact_mixed import both_modes  # (fast path, full grader) in reward and evaluation mode

logging.getLogger("math_verify").setLevel(logging.ERROR)

# (answer, gold, math-verify's verdict), each checked by hand against math-verify 0.9
DECIDED = [
    ("((-1,6))+1", "(-1,6)", False), ("((0,5))+1", "(1,6)", False), ("((15,-29))-2", "(15,-29)", False),
    ("((0,9) \\cup (9,36))+1", "(0,9) \\cup (9,36)", False), ("((2,\\infty))+1", "(2,\\infty)", False),
    ("([1,2])+1", "[2,3]", False), ("(\\{1,2\\})+1", "\\{2,3\\}", False),
    ("(\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix})+1", "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", False),
    ("(\\left( \\frac{3}{2}, -13 \\right))+1", "\\left( \\frac{3}{2}, -13 \\right)", False),
    ("(120^\\circ)+1", "120^\\circ", False), ("(119^\\circ)+1", "120^\\circ", True), ("(121^{\\circ})-1", "120", True),
    ("(137 \\frac{1}{2})+1", "137 \\frac{1}{2}", False), ("(136 \\frac{1}{2})+1", "137 \\frac{1}{2}", True),
    ("(1\\frac{4}{5})+1", "1\\frac{4}{5}", False), ("(0\\frac{4}{5})+1", "1\\frac{4}{5}", True),
    ("(\\$36)+1", "\\$36", False), ("(\\$35)+1", "\\$36", True), ("(\\$35)+1", "36", True),
]
UNDECIDED = [  # digit groups in parentheses are a tuple to math-verify; a polynomial; a one-element set
    ("(10,\\!079)+1", "10,\\!080"), ("(10,079)+1", "10,080"), ("((a+5)(b+2))+1", "(a+5)(b+2)"),
    ("(\\{5\\})+1", "\\{5, 7\\}"), ("(\\frac{19999}{\\pi})+1", "\\frac{20000}{\\pi}"), ("(1,2)+1", "(1,2)"),
]


@pytest.mark.parametrize("answer, gold, correct", DECIDED)
def test_decided_as_the_full_grader_and_math_verify_decide(answer, gold, correct):
    for quick, full in both_modes(answer, gold):
        assert full["correct"] is correct
        assert quick is not None and quick["correct"] is correct and quick["extracted"] == full["extracted"], quick


@pytest.mark.parametrize("answer, gold", UNDECIDED)
def test_left_to_the_workers(answer, gold):
    for quick, _ in both_modes(answer, gold):
        assert quick is None, quick


def test_the_split_by_hand():
    assert split_plus_number("((1,2))+1") == ("(1,2)", 1)
    assert split_plus_number(" (x) - 12 ") == ("x", -12)
    assert split_plus_number("(1)+(2)") is None and split_plus_number("(1))+(2") is None
    assert split_plus_number("(a)(b)+1") is None  # the first parenthesis closes before the last
    assert number_plus_number("(3^\\circ)+2", exact_number) == ("int", Fraction(5))
    assert number_plus_number("(1 \\frac{1}{2})-1", exact_number) == ("rational", Fraction(1, 2))
    assert number_plus_number("(\\frac{1}{2})+1", exact_number) is None  # the expression parser's case


small = st.integers(-30, 30)


def _tuple(xs):
    return "(" + ",".join(map(str, xs)) + ")"


structures = st.one_of(
    st.lists(small, min_size=2, max_size=4).map(lambda xs: (_tuple(xs), _tuple(xs))),
    st.lists(small, min_size=2, max_size=4, unique=True).map(
        lambda xs: ("\\{" + ",".join(map(str, xs)) + "\\}", "\\{" + ",".join(map(str, sorted(xs))) + "\\}")),
    st.tuples(small, st.integers(1, 9), st.sampled_from("([")).map(
        lambda t: (t[2] + "%d,%d)" % (t[0], t[0] + t[1]), "(%d,%d)" % (t[0], t[0] + t[1]))),
    st.lists(small, min_size=2, max_size=2).map(
        lambda xs: ("\\begin{pmatrix} %d \\\\ %d \\end{pmatrix}" % tuple(xs),) * 2),
)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(structures, st.integers(-3, 3).filter(bool))
def test_a_structure_plus_a_number_equals_the_full_grader(pair, n):
    written, gold = pair
    answer = "(%s)%s%d" % (written, "+" if n > 0 else "-", abs(n))
    for quick, full in both_modes(answer, gold):
        assert full["correct"] is False
        if quick is not None:
            assert quick["correct"] is False and quick["extracted"] == full["extracted"]


marks = st.one_of(
    st.integers(-90, 400).map(lambda d: ("%d^\\circ" % d, Fraction(d))),
    st.tuples(st.integers(0, 40), st.integers(1, 8), st.integers(2, 9), st.booleans()).map(
        lambda t: (("-" if t[3] else "") + "%d \\frac{%d}{%d}" % t[:3],
                   (-1 if t[3] else 1) * (t[0] + Fraction(t[1], t[2])))),
    st.integers(0, 500).map(lambda d: ("\\$%d" % d, Fraction(d))),
    st.integers(0, 50000).map(lambda c: ("\\$%d.%02d" % divmod(c, 100), Fraction(c, 100))),
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(marks, st.integers(-3, 3).filter(bool), st.integers(-2, 2))
def test_a_marked_number_plus_a_number_equals_the_full_grader(mark, n, off):
    written, value = mark
    answer = "(%s)%s%d" % (written, "+" if n > 0 else "-", abs(n))
    target = value + n + off  # equal to the answer's value when off is 0
    gold = str(target.numerator) if target.denominator == 1 else "\\frac{%d}{%d}" % (target.numerator, target.denominator)
    decided = 0
    for quick, full in both_modes(answer, gold):
        assert full["correct"] is (off == 0), (answer, gold)
        if quick is not None:
            decided += 1
            assert quick["correct"] is full["correct"] and quick["extracted"] == full["extracted"]
    # a wrong answer with a decimal is left to the workers, which also compare it at its places
    assert decided == 2 or ("." in written and off != 0)

"""Issue 41, item 3: the fast path decides polynomial golds (``x^3+3x-6``, ``\\frac{11+9a}{20}``) by exact
expansion with a parser of its own (:mod:`rlhf_ext.rewards.exact_polynomials`), and its verdicts are
math-verify's.

The parser's values by hand; what it refuses, with the latex2sympy readings that make each refusal
necessary pinned on real math-verify; hand-checked verdicts and a property test over random
polynomials (equal spellings and near misses), each against the full grader (the worker's code,
``grade_response``, in this thread) and real math-verify as the grader calls it, in reward mode
(``\\boxed{}``) and in evaluation mode (no anchor, ``require_anchor=False``).
"""

import logging
import random
from fractions import Fraction as F

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from math_verify import parse, verify

from rlhf_ext.rewards import prepare_gold
from rlhf_ext.rewards.exact_numbers import exact_verdict, gold_value
from rlhf_ext.rewards.exact_polynomials import polynomial_value
from rlhf_ext.rewards.extraction import answer_readings, find_answer_candidate
from rlhf_ext.rewards.math_verify_recipe import ANSWER_EXTRACTION, GOLD_EXTRACTION, grade_response

logging.getLogger("math_verify").setLevel(logging.ERROR)

VALUES = [
    ("x^3+3x-6", {(("x", 3),): F(1), (("x", 1),): F(3), (): F(-6)}),
    ("15x - 80", {(("x", 1),): F(15), (): F(-80)}),
    ("\\frac{11+9a}{20}", {(): F(11, 20), (("a", 1),): F(9, 20)}),
    ("(x+1)^2", {(("x", 2),): F(1), (("x", 1),): F(2), (): F(1)}),
    ("\\left(x+1\\right)^{2}-1", {(("x", 2),): F(1), (("x", 1),): F(2)}),
    ("-x^2", {(("x", 2),): F(-1)}),
    ("x\\cdot y+2\\times y", {(("x", 1), ("y", 1)): F(1), (("y", 1),): F(2)}),
    ("(x^3+3x-6)+1", {(("x", 3),): F(1), (("x", 1),): F(3), (): F(-5)}),
    ("x^{0}+k", {(): F(1), (("k", 1),): F(1)}),
    ("x^{2}+{x}", {(("x", 2),): F(1), (("x", 1),): F(1)}),
]
REFUSED = [
    "2 x",  # a space between a coefficient and its letter (``2 i`` is another symbol than ``2i``)
    "xy", "ln", "dx",  # letters side by side: products, or a differential symbol
    "2(k+1)", "(a+5)(b+2)", "x(x+1)",  # juxtaposed groups
    "x^12",  # x^1 times 2 in LaTeX
    "e+1", "i+1", "2i", "X+1", "E", "o",  # Euler's number, the imaginary i, upper case read lower case
    "x^{13}", "(x+y+z)^{12}", "x^{-1}", "2^x", "x^y",  # degree, exponents
    "x/2", "\\frac{1}{x}", "\\frac{x}{0}", "0.5x", "x+1.0",  # division by a letter or zero, decimals
    "{x+1}", "{x}+1",  # braces around the answer make a set (refused whenever it starts with one)
    "y = 2x + 3", "\\sin x", "x!", "x-x", "5", "\\frac{1}{2}x", "x^2y", "{x+1}^2", "--x",
]


@pytest.mark.parametrize("text, terms", VALUES)
def test_the_parser_expands_polynomials(text, terms):
    assert polynomial_value(text) == terms


@pytest.mark.parametrize("text", REFUSED)
def test_the_parser_refuses(text):
    assert polynomial_value(text) is None


def _boxed_parse(text: str, gold: bool):
    return parse("\\boxed{" + text + "}", extraction_config=GOLD_EXTRACTION if gold else ANSWER_EXTRACTION,
                 extraction_mode="first_match")


def math_verify_as_called(gold_text: str, raw: str) -> bool:
    return bool(verify(_boxed_parse(gold_text, True), _boxed_parse(raw, False)))


def test_the_readings_that_make_the_refusals_necessary():
    """What real math-verify does with the forms the parser refuses."""
    assert not math_verify_as_called("2i", "2 i") and math_verify_as_called("2i", "i2")
    assert math_verify_as_called("x+1", "X+1")  # upper case is read lower case...
    import sympy

    assert _boxed_parse("e", True)[0] == sympy.E  # ...but e is Euler's number and E the letter e
    assert _boxed_parse("E", False)[0] == sympy.Symbol("e", real=True)
    assert math_verify_as_called("2k+2", "2(k+1)")  # a product here, where 2(3) is the mixed number 5
    assert not math_verify_as_called("6", "2(3)")
    assert str(_boxed_parse("{x+1}", False)[0]) == "{x + 1}"  # a set


def _verdicts(answer: str, gold: str):
    """(fast path, full grader, math-verify) in reward mode, and (fast path, full grader) in evaluation
    mode (the answer as the last expression of a response without an anchor)."""
    gold_text = prepare_gold(gold)
    response = "So the final answer is $\\boxed{%s}$." % answer
    quick = exact_verdict(response, gold_text)
    full = grade_response(response, gold_text, {})
    raw = find_answer_candidate(response).raw
    mv = math_verify_as_called(gold_text, raw) if answer_readings(raw) == [raw] else None
    plain = "We simplify and get $%s$" % answer
    quick_eval = exact_verdict(plain, gold_text, require_anchor=False)
    full_eval = grade_response(plain, gold_text, {}, require_anchor=False)
    return quick, full, mv, quick_eval, full_eval


HAND = [
    ("x^3+3x-6", "x^3+3x-6", True), ("3x+x^3-6", "x^3+3x-6", True), ("(x^3+3x-6)+1", "x^3+3x-6", False),
    ("x^3+3x-7", "x^3+3x-6", False), ("15x-80", "15x - 80", True), ("15x - 81", "15x - 80", False),
    ("2k+2", "2k+2", True), ("2k+3", "2k+2", False), ("\\frac{11+9a}{20}", "\\frac{11+9a}{20}", True),
    ("\\frac{9a+11}{20}", "\\frac{11+9a}{20}", True), ("\\frac{11+9a}{21}", "\\frac{11+9a}{20}", False),
    ("x^2+2x+1", "(x+1)^2", True), ("x^2+2x+2", "(x+1)^2", False), ("\\dfrac{2x+2}{2}", "x+1", True),
    ("y+1", "x+1", False), ("x^3+3x-6", "x^3+3y-6", False),
]


@pytest.mark.parametrize("answer, gold, correct", HAND)
def test_hand_checked_verdicts_equal_the_full_path_and_math_verify(answer, gold, correct):
    quick, full, mv, quick_eval, full_eval = _verdicts(answer, gold)
    assert quick is not None and quick["correct"] is correct
    assert quick == full
    assert mv is correct
    assert quick_eval is not None and quick_eval == full_eval


def test_polynomial_golds_are_read_and_numbers_are_not_theirs():
    assert isinstance(gold_value("x^3+3x-6"), dict)
    assert not isinstance(gold_value("5"), dict) and not isinstance(gold_value("\\frac{1}{2}"), dict)
    assert gold_value("y = 2x + 3") is None and gold_value("(a+5)(b+2)") is None
    # a number against a polynomial gold, or an unreadable answer: the workers
    assert exact_verdict("\\boxed{5}", "x+1") is None and exact_verdict("\\boxed{2 x+1}", "2x+1") is None


# --- random polynomials ---------------------------------------------------------------------------

def _term(coef: int, var: str, exp: int) -> str:
    if exp == 0:
        return str(coef)
    body = var if exp == 1 else "%s^%s" % (var, exp if exp < 10 else "{%d}" % exp)
    return (str(coef) if coef != 1 else "") + body


@st.composite
def polynomial_samples(draw):
    """(answer, gold): a random polynomial as the gold; the answer its terms reordered, spaced or grouped,
    or a near miss (plus one, a coefficient moved, another letter)."""
    var = draw(st.sampled_from("xyknab"))
    terms = draw(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 4)), min_size=1, max_size=4,
                          unique_by=lambda t: t[1]))
    if all(e == 0 for _, e in terms):
        terms.append((1, 1))
    signs = draw(st.lists(st.sampled_from("+-"), min_size=len(terms), max_size=len(terms)))

    def write(ts, ss, spaced=False):
        out = ""
        for i, ((c, e), s) in enumerate(zip(ts, ss)):
            t = _term(c, var, e)
            out += (("-" if s == "-" else "") + t) if i == 0 else ((" %s " if spaced else "%s") % s + t)
        return out

    gold = write(terms, signs)
    rng = random.Random(draw(st.integers(0, 2 ** 16)))
    order = list(range(len(terms)))
    rng.shuffle(order)
    moved = list(terms)
    k = rng.randrange(len(moved))
    moved[k] = (moved[k][0] + 1, moved[k][1])
    forms = [gold, write([terms[i] for i in order], [signs[i] for i in order], spaced=True),
             "(" + gold + ")+0", "\\frac{%s}{1}" % gold,
             "(" + gold + ")+1", write(moved, signs), gold.replace(var, "z" if var != "z" else "w")]
    return draw(st.sampled_from(forms)), gold


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(polynomial_samples())
def test_random_polynomials_equal_the_full_path_and_math_verify(sample):
    answer, gold = sample
    quick, full, mv, quick_eval, full_eval = _verdicts(answer, gold)
    if quick is not None:
        assert quick == full, sample
        if mv is not None:
            assert quick["correct"] is mv, sample
    if quick_eval is not None:
        assert quick_eval == full_eval, sample


def test_the_random_forms_are_mostly_decided_both_ways():
    """The property compares something: most generated forms are decided, right and wrong alike."""
    decided = correct = total = 0
    for seed in range(60):
        rng = random.Random(seed)
        var = rng.choice("xykn")
        gold = "%d%s^2+%d%s-%d" % (rng.randint(2, 9), var, rng.randint(2, 9), var, rng.randint(1, 9))
        for answer in (gold, "(" + gold + ")+1", gold.replace("+", " + "), "(" + gold + ")+0"):
            total += 1
            quick = exact_verdict("\\boxed{%s}" % answer, prepare_gold(gold))
            if quick is not None:
                decided += 1
                correct += quick["correct"]
    assert decided == total and correct == 3 * total // 4

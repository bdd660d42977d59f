"""Issue 41: the fast path reads exact arithmetic (``(\\frac{1}{2})+1``, ``\\frac{1+\\sqrt{5}}{2}``,
``\\frac{1}{\\sqrt{3}}``, ``2\\cdot 3``) with a parser of its own, and its verdicts are math-verify's.

Three kinds of checks: the parser's values, computed by hand; what it must refuse (each a form
math-verify reads otherwise, or no exact number, or hostile); and a property test over the real
MATH-500 golds with generated equal forms and near misses: wherever the fast path decides, its verdict
equals the full grader's (the worker's code, ``grade_response``, in this thread) and real math-verify's
as the grader calls it (on the samples the grader's rewriting leaves alone).
``RLHF_EXT_PROPERTY_EXAMPLES`` raises the number of examples for a long run (docs/benchmarks.md).
"""

import ast
import json
import logging
import os
import random
import re
import time
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from math_verify import parse, verify

import rlhf_ext.rewards.exact_expressions as exact_expressions
import rlhf_ext.rewards.exact_numbers as exact_numbers
from rlhf_ext.rewards import prepare_gold
from rlhf_ext.rewards.exact_expressions import expression_value
from rlhf_ext.rewards.exact_numbers import exact_verdict
from rlhf_ext.rewards.extraction import answer_readings, find_answer_candidate
from rlhf_ext.rewards.math_verify_recipe import ANSWER_EXTRACTION, GOLD_EXTRACTION, grade_response

MATH500 = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "math500.jsonl"
F = Fraction


# --- the parser's values, by hand ----------------------------------------------------------------

VALUES = [
    ("(2)+1", {1: F(3)}, False),
    ("\\left(\\frac{1}{2}\\right)+1", {1: F(3, 2)}, False),
    ("(\\frac{1}{2})+1", {1: F(3, 2)}, False),
    ("\\frac{1+\\sqrt{5}}{2}", {1: F(1, 2), 5: F(1, 2)}, False),
    ("\\frac{1}{\\sqrt{3}}", {3: F(1, 3)}, False),  # sympy: sqrt(3)/3
    ("\\frac{2}{\\sqrt{2}}", {2: F(1)}, False),
    ("\\frac{\\sqrt{3}}{2}", {3: F(1, 2)}, False),
    ("\\dfrac{3}{4}+\\tfrac{1}{4}", {1: F(1)}, False),
    ("2\\cdot 3", {1: F(6)}, False),
    ("2\\times\\frac{1}{2}", {1: F(1)}, False),
    ("1/2/3", {1: F(1, 6)}, False),
    ("-(2)", {1: F(-2)}, False),
    ("\\frac{-1}{2}", {1: F(-1, 2)}, False),
    ("\\sqrt{2}\\cdot\\sqrt{8}", {1: F(4)}, False),
    ("\\sqrt{2}\\cdot\\sqrt{3}", {6: F(1)}, False),
    ("(\\sqrt{2}+1)\\cdot(\\sqrt{2}-1)", {1: F(1)}, False),
    ("\\frac{1}{2}\\pi", {0: F(1, 2)}, False),
    ("\\frac{-\\pi}{6}", {0: F(-1, 6)}, False),
    ("3\\sqrt{5}", {5: F(3)}, False),
    ("\\sqrt{12}", {3: F(2)}, False),
    ("\\sqrt{0}+1", {1: F(1)}, False),
    ("(16 \\sqrt{3})+1", {1: F(1), 3: F(16)}, False),
    ("\\sqrt{2}-\\sqrt{2}", {}, False),
    ("{1}/{2}", {1: F(1, 2)}, False),
    ("(3.21)+1", {1: F(421, 100)}, True),
    (".5\\cdot 4", {1: F(2)}, True),
]


@pytest.mark.parametrize("text, terms, decimal", VALUES)
def test_the_parser_reads_exact_values(text, terms, decimal):
    assert expression_value(text) == (terms, decimal)


REFUSED = [
    # side by side: math-verify reads mixed numbers (2(3) is 5, 2 3 is 5, (1)(2) is 3, 1\frac{4}{5} is 9/5)
    "2(3)", "2 3", "(1)(2)", "1\\frac{4}{5}", "(2)\\sqrt{3}", "\\pi 2",
    # runs of signs and signs after an operator (math-verify reads -+1+1 as +1+1)
    "--1", "1+-2", "-+1+1", "2\\cdot-3", "2/-3",
    # not an exact number of this basis, or not a number
    "2^{3}", "3!", "x+1", "\\sqrt{x}", "\\sqrt{1.5}", "\\sqrt[3]{2}", "\\pi\\sqrt{2}", "\\pi\\cdot\\pi",
    "\\frac{1}{\\pi}", "\\frac{1}{1+\\sqrt{2}}", "\\frac{1}{0}", "1/(2-2)", "(1,2)", "50\\%", "30^\\circ",
    "1e5", "5.", "\\text{5}", "(2", "2)", "\\left[1\\right]", "{}", "", "()", "+", "\\frac{1}", "\\sqrt{}",
    "1" * 31, "\\sqrt{1000000001}", "\\left\\{2\\right\\}", "\\{2\\}+1", "__import__('os').system('true')", "2 + 3i", "\\infty",
    "(" * 13 + "1" + ")" * 13,  # nested past the depth limit
    "+".join(["\\sqrt{%d}" % p for p in (2, 3, 5, 7, 11, 13, 17, 19, 23)]),  # more than 8 terms
]


@pytest.mark.parametrize("text", REFUSED)
def test_the_parser_refuses(text):
    assert expression_value(text) is None


def test_the_fast_path_modules_never_evaluate_text():
    """No eval/exec/compile, no sympy parsing: the answers are read by the parser, never run."""
    for module in (exact_expressions, exact_numbers):
        tree = ast.parse(Path(module.__file__).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}  # builtins are names
        attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        for bad in ("eval", "exec", "compile", "__import__"):
            assert bad not in names, (module.__name__, bad)
        for bad in ("sympify", "parse_expr", "parse_latex", "eval"):
            assert bad not in names | attributes, (module.__name__, bad)
        assert not any("sympy" in m or "math_verify" in m for m in imported), (module.__name__, imported)


def test_hostile_arithmetic_costs_little():
    texts = ["(" * 60 + ")" * 60, "\\sqrt{99999989}\\cdot" * 5 + "\\sqrt{99999971}", "1/" * 59 + "1",
             "\\frac{" * 20 + "1" + "}{2}" * 20, ("(1+\\sqrt{2})\\cdot" * 8)[:-5]]
    start = time.perf_counter()
    for text in texts:
        for _ in range(20):
            exact_verdict("\\boxed{%s}" % text, "1")
    assert time.perf_counter() - start < 1.0


# --- verdicts against the full grader and real math-verify --------------------------------------

def full(response: str, gold_text: str) -> dict:
    return grade_response(response, gold_text, {})


def math_verify_as_called(gold_text: str, raw: str) -> bool:
    """Real math-verify as the grader's worker calls it (its extraction configurations, the gold and
    the answer each boxed), without the grader's rewriting: compared only where it rewrites nothing."""
    gold = parse("\\boxed{" + gold_text + "}", extraction_config=GOLD_EXTRACTION, extraction_mode="first_match")
    answer = parse("\\boxed{" + raw + "}", extraction_config=ANSWER_EXTRACTION, extraction_mode="first_match")
    return bool(verify(gold, answer))


HAND = [
    # (answer, gold, verdict): each pair checked against the full path and math-verify below
    ("(\\frac{1}{2})+1", "\\frac{1}{2}", False), ("(\\frac{1}{2})+1", "\\frac{3}{2}", True),
    ("\\frac{1}{\\sqrt{3}}", "\\frac{\\sqrt{3}}{3}", True), ("\\frac{1}{2}\\pi", "\\frac{\\pi}{2}", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True), ("0.5", "\\frac12", True), ("\\dfrac{3}{4}", "0.75", True),
    ("-\\frac{1}{2}", "\\frac{-1}{2}", True), ("(1, 2)", "(1,2)", True), ("(16\\sqrt{3})+1", "16 \\sqrt{3}", False),
    ("\\frac{1+\\sqrt{5}}{2}", "\\frac{1}{2}+\\frac{\\sqrt{5}}{2}", True), ("\\frac{1-\\sqrt{5}}{2}", "\\frac{1+\\sqrt{5}}{2}", False),
    ("2\\cdot 3", "6", True), ("-(2)", "-2", True), ("(3.21)+1", "3.21", False), ("(-\\frac{35}{9})+1", "-\\frac{26}{9}", True),
    ("\\frac{2}{\\sqrt{2}}", "\\sqrt{2}", True), ("(\\sqrt{2}+1)\\cdot(\\sqrt{2}-1)", "1", True),
    ("\\left( \\frac{1+\\sqrt{5}}{2}, -1 \\right)", "(\\frac{1+\\sqrt5}{2},-1)", True),
    # a mixed number (rlhf_ext.rewards.exact_mixed, session 15), read before the expression parser
    ("1\\frac{4}{5}", "\\frac{9}{5}", True),
    # a tuple or a degree in parentheses plus a number (rlhf_ext.rewards.exact_near_misses)
    ("((1,2))+1", "(1,2)", False), ("(30^\\circ)+1", "30^\\circ", False),
    # left to the workers: decimals close to the gold, percentages
    ("(3.21)+1", "4.21", None), ("2(3)", "6", None), ("(49)+1", "50\\%", None),
]


@pytest.mark.parametrize("answer, gold, correct", HAND)
def test_hand_checked_verdicts_equal_the_full_path_and_math_verify(answer, gold, correct):
    response = "So the answer is \\boxed{%s}." % answer
    gold_text = prepare_gold(gold)
    quick = exact_verdict(response, gold_text)
    if correct is None:
        assert quick is None
        return
    assert quick is not None and quick["correct"] is correct
    assert quick == full(response, gold_text)
    assert math_verify_as_called(gold_text, find_answer_candidate(response).raw) is correct


def check_where_decided(response: str, answer: str, gold: str) -> None:
    """Where the fast path decides ``response``: its verdict is the full grader's and, where the grader
    rewrites neither side, real math-verify's."""
    gold_text = prepare_gold(gold)
    quick = exact_verdict(response, gold_text)
    if quick is None:
        return
    assert quick == full(response, gold_text), (answer, gold)
    raw = find_answer_candidate(response).raw
    if answer_readings(gold_text) == [gold_text] and answer_readings(raw) == [raw]:
        assert quick["correct"] == math_verify_as_called(gold_text, raw), (answer, gold)


def _math500_golds():
    with open(MATH500, encoding="utf-8") as f:
        return [json.loads(line)["answer"] for line in f]


def _last_digit_changed(text: str, rng: random.Random):
    digits = [m.start() for m in re.finditer(r"\d", text)]
    if not digits:
        return None
    i = rng.choice(digits)
    return text[:i] + str((int(text[i]) + rng.choice((1, 9))) % 10) + text[i + 1:]


def _equal_forms(gold: str):
    """Spellings of the same value (as a reader would write them), or []."""
    out = []
    m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", gold)
    if m:
        sign, num, den = m.group(1), int(m.group(2)), int(m.group(3))
        out += ["\\frac{%s%d}{%d}" % (sign, num, den), "%s\\dfrac{%d}{%d}" % (sign, 2 * num, 2 * den),
                "%s%d/%d" % (sign, num, den), "(%s\\frac{%d}{%d})" % (sign, num, den)]
        rest = den
        for p in (2, 5):
            while rest and rest % p == 0:
                rest //= p
        if rest == 1 and len(str(num)) < 7:
            out.append(sign + repr(num / den))
    m = re.fullmatch(r"(-?\d+)", gold)
    if m:
        n = int(gold)
        out += ["\\frac{%d}{2}" % (2 * n), "(%d)" % n, "%d\\cdot 1" % n, "(%d)+0" % n, "\\sqrt{%d}" % (n * n) if n >= 0 else "-(%d)" % -n]
    m = re.fullmatch(r"(\d*)\s*\\sqrt\{?(\d+)\}?", gold)
    if m:
        k, r = int(m.group(1) or 1), int(m.group(2))
        out += ["\\sqrt{%d}" % (k * k * r), "%d\\cdot\\sqrt{%d}" % (k, r), "\\frac{%d}{\\sqrt{%d}}" % (k * r, r)]
    m = re.fullmatch(r"\\[dt]?frac\{(\d*)\s*\\pi\}\{(\d+)\}", gold)
    if m:
        out += ["\\frac{%s}{%s}\\pi" % (m.group(1) or 1, m.group(2))]
    if gold.startswith("(") and "," in gold:
        out += [gold.replace(",", ", "), "\\left" + gold[0] + gold[1:-1] + "\\right" + gold[-1]]
    return out


def _near_misses(gold: str, rng: random.Random):
    out = ["(" + gold + ")+1", "-(" + gold + ")", "2\\cdot(" + gold + ")", "(" + gold + ")-\\frac{1}{2}"]
    changed = _last_digit_changed(gold, rng)
    if changed is not None:
        out.append(changed)
    return out


@st.composite
def math500_samples(draw):
    """A MATH-500 gold that the fast path reads, and one of: the gold itself, an equal form, a near miss."""
    gold = draw(st.sampled_from(DECIDED_GOLDS))
    rng = random.Random(draw(st.integers(0, 2 ** 16)))
    forms = [gold] + _equal_forms(gold) + _near_misses(gold, rng)
    return draw(st.sampled_from(forms)), gold


DECIDED_GOLDS = [g for g in _math500_golds() if exact_numbers.gold_value(prepare_gold(g)) is not None]
EXAMPLES = int(os.environ.get("RLHF_EXT_PROPERTY_EXAMPLES", "150"))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(math500_samples())
def test_math500_forms_equal_the_full_path_and_math_verify(sample):
    answer, gold = sample
    response = "Therefore the final answer is $\\boxed{%s}$." % answer
    check_where_decided(response, answer, gold)


def test_the_math500_forms_are_mostly_decided_both_ways():
    """The forms the property draws from are decided by the fast path, right and wrong alike (else the
    property would compare little): every gold's forms, without the full grader."""
    rng = random.Random(0)
    decided, correct = 0, 0
    total = 0
    for gold in DECIDED_GOLDS:
        for answer in [gold] + _equal_forms(gold) + _near_misses(gold, rng):
            total += 1
            quick = exact_verdict("\\boxed{%s}" % answer, prepare_gold(gold))
            if quick is not None:
                decided += 1
                correct += quick["correct"]
    assert decided >= 0.9 * total and 0.25 * decided <= correct <= 0.75 * decided, (decided, correct, total)


def test_most_math500_golds_are_read():
    # the other 69 are text, polynomials, matrices, intervals, complex numbers, other bases: workers
    assert len(DECIDED_GOLDS) >= 431


logging.getLogger("math_verify").setLevel(logging.ERROR)


# --- random arithmetic against the full path and math-verify ------------------------------------

_ATOMS = st.one_of(
    st.integers(0, 60).map(str),
    st.tuples(st.integers(1, 40), st.integers(1, 12)).map(lambda t: "\\frac{%d}{%d}" % t),
    st.tuples(st.integers(1, 6), st.sampled_from([2, 3, 5, 8, 12, 18])).map(lambda t: "%d\\sqrt{%d}" % t),
    st.sampled_from(["\\sqrt{2}", "\\sqrt{3}", "\\pi", "2\\pi", "\\frac{\\pi}{3}", "\\frac{\\sqrt{3}}{2}", "0.5", "1.25"]),
)


@st.composite
def arithmetic(draw, depth=0):
    """Random arithmetic in the forms the parser reads (and some it refuses), as a model writes it."""
    if depth >= 2 or draw(st.booleans()):
        return draw(_ATOMS)
    a, b = draw(arithmetic(depth + 1)), draw(arithmetic(depth + 1))
    form = draw(st.sampled_from(["%s+%s", "%s-%s", "(%s)+%s", "\\left(%s\\right)-%s", "(%s)\\cdot(%s)",
                                 "%s\\times %s", "\\frac{%s}{%s}", "-(%s)+%s", "(%s)/(%s)", "%s %s"]))
    return form % (a, b)


@settings(max_examples=max(25, EXAMPLES // 6), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(arithmetic(), arithmetic(), st.booleans())
def test_random_arithmetic_equals_the_full_path_and_math_verify(gold, other, same):
    # an answer equal in value (the gold plus zero, regrouped) or another expression
    answer = "(" + gold + ")+0" if same else other
    response = "So the answer is \\boxed{%s}." % answer
    check_where_decided(response, answer, gold)


# --- sets ------------------------------------------------------------------------------------------

SET_CASES = [
    ("\\{2,1\\}", "\\{1,2\\}", True), ("\\{1,3\\}", "\\{1,2\\}", False), ("\\{1,2,2\\}", "\\{1,2\\}", True),
    ("\\{1,2\\}", "\\{1,2,3\\}", False), ("\\{1,\\sqrt{2}\\}", "\\{\\sqrt2,1\\}", True), ("\\{1,-1\\}", "\\{-1,1\\}", True),
    ("\\left\\{1,2\\right\\}", "\\{1,2\\}", True), ("\\{(1)+1,1\\}", "\\{1,2\\}", True), ("\\{2\\}", "\\{1\\}", False),
    ("\\{-2,\\frac{1}{2}+\\frac{\\sqrt{5}}{2}\\}", "\\{\\frac{1+\\sqrt5}{2},-2\\}", True), ("\\{2, \\pi, 3\\}", "\\{\\pi, 2\\}", False),
    # left to the workers: math-verify accepts a set against a tuple, a list or a number; decimals in sets
    ("(1,2)", "\\{1,2\\}", None), ("1,2", "\\{1,2\\}", None), ("1", "\\{1\\}", None), ("\\{-3, 0.5\\}", "\\{\\frac12,-3\\}", None),
    ("\\{1.0000001,2\\}", "\\{1,2\\}", None), ("\\{1\\},\\{2\\}", "\\{1,2\\}", None), ("\\{1\\pm\\sqrt{5},-2\\}", "\\{1\\pm\\sqrt{5},-2\\}", None),
]


@pytest.mark.parametrize("answer, gold, correct", SET_CASES)
def test_sets_hand_checked(answer, gold, correct):
    test_hand_checked_verdicts_equal_the_full_path_and_math_verify(answer, gold, correct)


@st.composite
def set_samples(draw):
    """A set of 1-4 exact atoms and an answer set: reordered, with a repeat, an element changed, one
    more or one fewer element."""
    atoms = draw(st.lists(_ATOMS.filter(lambda a: "." not in a), min_size=1, max_size=4))
    answer = list(atoms)
    change = draw(st.sampled_from(["shuffle", "repeat", "change", "extra", "drop"]))
    if change == "shuffle":
        answer = draw(st.permutations(answer))
    elif change == "repeat":
        answer = answer + [answer[0]]
    elif change == "change":
        answer[-1] = "(" + answer[-1] + ")+1"
    elif change == "extra":
        answer.append(draw(_ATOMS.filter(lambda a: "." not in a)))
    elif len(answer) > 1:
        answer = answer[1:]
    return "\\{" + ", ".join(answer) + "\\}", "\\{" + ",".join(atoms) + "\\}"


@settings(max_examples=max(25, EXAMPLES // 6), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(set_samples())
def test_sets_equal_the_full_path_and_math_verify(sample):
    answer, gold = sample
    check_where_decided("The answer is $\\boxed{%s}$." % answer, answer, gold)

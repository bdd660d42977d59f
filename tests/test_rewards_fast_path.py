"""Issue 27: the grader's fast path decides plain numbers exactly, and never changes a verdict.

The full path is the worker's exact code (``grade_response``: the grader's extraction and rewriting,
then real math-verify) in this main thread; the fast path is :func:`exact_verdict`. Hypothesis
generates numbers and many spellings of each (integers with signs, leading zeros, comma / LaTeX /
space thousands, decimals, ``\\frac`` / ``\\dfrac`` / unbraced / slash fractions, percentages, units,
currency), answers right and wrong (off by one, off by 1e-7, a hundredfold, negated, inverted), in
every anchor the extraction reads, in both grading modes. Wherever the fast path decides, its
verdict (``correct``, ``extracted``, ``gold_parsed``) must be the full path's; and on spellings
where the grader makes no deliberate difference, real math-verify as its own test suite calls it
must agree too.
"""

import logging
import math
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from rlhf_ext.rewards import MathGrader, prepare_gold
from rlhf_ext.rewards.exact_numbers import ExactNumber, exact_number, exact_verdict, gold_number, numbers_equal
from rlhf_ext.rewards.extraction import find_answer_candidate
from rlhf_ext.rewards.math_verify_recipe import grade_response

PROPERTY = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# The later shapes (roots, degrees, pi, tuples, sums) each run fewer examples here; a run with 2,500-3,000
# examples per property is recorded in docs/benchmarks.md.
NEW_PROPERTY = settings(PROPERTY, max_examples=120)


class _Timeouts(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        if "Timeout" in record.getMessage():
            self.count += 1


def without_timeouts(grade, *args):
    """``grade(*args)``, repeated when math-verify's own 5 s alarm fired: on a saturated machine a
    gold as plain as ``0`` can time out and read as unparsed, and a timeout is no verdict."""
    watch = _Timeouts()
    logger = logging.getLogger("math_verify")
    logger.addHandler(watch)
    try:
        for _ in range(3):
            watch.count = 0
            out = grade(*args)
            if not watch.count:
                return out
    finally:
        logger.removeHandler(watch)
    raise RuntimeError(f"math-verify timed out three times on {args!r}: the machine is overloaded")


def full(response: str, gold, require_anchor: bool = True) -> dict:
    """The worker's verdict: its code, in this main thread."""
    return without_timeouts(lambda: grade_response(response, prepare_gold(gold), {}, require_anchor=require_anchor))


def fast(response: str, gold, require_anchor: bool = True):
    return exact_verdict(response, prepare_gold(gold), require_anchor)


# --- spellings -----------------------------------------------------------------------------------

def _group(digits: str, sep: str) -> str:
    head = len(digits) % 3 or 3
    return sep.join([digits[:head]] + [digits[i:i + 3] for i in range(head, len(digits), 3)])


def spellings(value: Fraction, draw) -> str:
    """One way a person or a model writes ``value`` (exactly that value, as the grader reads it)."""
    sign = "-" if value < 0 else ""
    mag = abs(value)
    forms = []
    if mag.denominator == 1:
        n = str(mag.numerator)
        forms += [sign + n, ("+" if not sign else sign) + n, sign + "0" + n, sign + n + ".0", sign + n + ".00"]
        if len(n) > 3:
            forms += [sign + _group(n, sep) for sep in (",", "\\,", "{,}", "~", " ", "\\;")]
        forms += ["\\frac{%s%d}{1}" % (sign, mag.numerator), "%s\\frac{%d}{2}" % (sign, 2 * mag.numerator)]
        if mag.numerator < 10 ** 6:
            forms += ["%s\\text{ cm}" % (sign + n), "%s m^2" % (sign + n)] if not sign else []
            forms += ["\\$%s" % n, "%s €" % n] if not sign else []
            forms += ["%d\\%%" % (100 * mag.numerator), "%d%%" % (100 * mag.numerator)] if not sign else []
    else:
        p, q = mag.numerator, mag.denominator
        forms += ["%s\\frac{%d}{%d}" % (sign, p, q), "%s\\dfrac{%d}{%d}" % (sign, p, q),
                  "\\frac{%s%d}{%d}" % (sign, p, q), "%s%d/%d" % (sign, p, q), "%s\\tfrac{%d}{%d}" % (sign, p, q)]
        if p < 10 and q < 10:
            forms.append("%s\\frac%d%d" % (sign, p, q))
        q2 = q
        for f in (2, 5):
            while q2 % f == 0:
                q2 //= f
        if q2 == 1:  # a terminating decimal
            text = format(mag.numerator / mag.denominator, ".12f").rstrip("0")
            if Fraction(text) == mag:
                forms += [sign + text, sign + text + "0"]
                if text.startswith("0."):
                    forms.append(sign + text[1:])
                if not sign:
                    pct = mag * 100
                    if pct.denominator == 1:
                        forms.append("%d\\%%" % pct.numerator)
                    else:
                        pct_text = format(pct.numerator / pct.denominator, ".10f").rstrip("0")
                        if Fraction(pct_text) == pct:
                            forms.append(pct_text + "\\%")
    return draw(st.sampled_from(forms))


def wrap(answer: str, draw, require_anchor: bool) -> str:
    body = "Adding the two parts gives the total.\n"
    forms = ["\\boxed{%s}" % answer, body + "So the answer is $\\boxed{%s}$." % answer,
             body + "The answer is %s." % answer, body + "#### %s" % answer, "<answer>\n%s\n</answer>" % answer,
             body + "Final answer: $%s$" % answer, "<think>try \\boxed{0}</think><answer>%s</answer>" % answer]
    if not require_anchor:
        forms += [body + "So the result is $%s$." % answer]
    return draw(st.sampled_from(forms))


def gold_form(value: Fraction, draw):
    text = spellings(value, draw)
    forms = [text, "$%s$" % text, "Solution text ... so it is $\\boxed{%s}$." % text]
    if value.denominator == 1:
        forms += [int(value), "Natalia sold %d clips.\n#### %d" % (abs(value), value), float(value)]
        if abs(value) >= 1000:
            forms.append("#### " + ("-" if value < 0 else "") + _group(str(abs(value.numerator)), ","))
    elif (value * 1000).denominator == 1:
        forms.append(float(value))
    return draw(st.sampled_from(forms))


values = st.one_of(
    st.integers(-50, 1000).map(Fraction),
    st.integers(1000, 10 ** 9).map(Fraction),
    st.integers(10 ** 12, 10 ** 22).map(Fraction),
    st.builds(Fraction, st.integers(-99, 99), st.integers(1, 40)),
    st.builds(lambda n, k: Fraction(n, 10 ** k), st.integers(-10 ** 7, 10 ** 7), st.integers(1, 7)),
)


def wrong_twin(value: Fraction, draw) -> Fraction:
    how = draw(st.sampled_from(["plus1", "minus1", "tiny", "small", "hundred", "neg", "inverse", "tenth"]))
    if how == "plus1":
        return value + 1
    if how == "minus1":
        return value - 1
    if how == "tiny":
        return value + Fraction(1, 10 ** 7)   # below math-verify's rounding: may still be "right"
    if how == "small":
        return value + Fraction(1, 10 ** 5)
    if how == "hundred":
        return value * 100 if value else Fraction(100)
    if how == "neg":
        return -value if value else Fraction(1)
    if how == "inverse":
        return 1 / value if value else Fraction(2)
    return value / 10


@st.composite
def samples(draw):
    require_anchor = draw(st.booleans())
    gold_value = draw(values)
    right = draw(st.booleans())
    answer_value = gold_value if right else wrong_twin(gold_value, draw)
    gold = gold_form(gold_value, draw)
    answer = spellings(answer_value, draw)
    return wrap(answer, draw, require_anchor), gold, require_anchor


# --- the property ----------------------------------------------------------------------------------

DECIDED = []


@PROPERTY
@given(samples())
def test_fast_path_verdicts_equal_the_full_path(sample):
    response, gold, require_anchor = sample
    quick = fast(response, gold, require_anchor)
    if quick is None:
        return
    DECIDED.append(quick["correct"])
    assert quick == full(response, gold, require_anchor), (response, gold, require_anchor)


def test_the_property_decides_most_of_what_it_generates():
    """Not a vacuous property: the same generated samples are mostly decided, right and wrong alike."""
    decided = []

    @PROPERTY
    @given(samples())
    def collect(sample):
        quick = fast(*sample)
        if quick is not None:
            decided.append(quick["correct"])

    collect()
    assert len(decided) >= 150 and 40 <= sum(decided) <= len(decided) - 40, (len(decided), sum(decided))


_REFERENCE_CONFIG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def reference(gold: str, response: str) -> bool:
    """math-verify as its own test suite calls it (tests/test_all.py in huggingface/Math-Verify),
    on our own generated strings."""
    return without_timeouts(lambda: bool(verify(parse(gold, _REFERENCE_CONFIG), parse(response, _REFERENCE_CONFIG),
                                                float_rounding=6, strict=True)))


@st.composite
def plain_samples(draw):
    """Spellings math-verify reads as the grader does (no thousands spacing, units or decimal comma)."""
    gold_value = draw(values)
    value = gold_value if draw(st.booleans()) else wrong_twin(gold_value, draw)
    gold = spellings(gold_value, draw)
    answer = spellings(value, draw)
    for text in (gold, answer):
        assume(not any(s in text for s in ("\\,", "{,}", "~", " ", "\\;", "cm", "€", "\\$", ",")))
    return "\\boxed{%s}" % answer, gold


@PROPERTY
@given(plain_samples())
def test_fast_path_agrees_with_real_math_verify(sample):
    response, gold = sample
    quick = fast(response, gold)
    if quick is not None:
        assert quick["correct"] == reference("$%s$" % gold, response), sample


# --- hand-checked cases ------------------------------------------------------------------------------

CASES = [
    # (answer in a box, gold, correct) -- each decided by the fast path and equal to the full path
    ("42", "42", True), ("42", "43", False), ("042", "42", True), ("+42", "42", True), ("-7", "-7", True),
    ("-7", "7", False), ("1,000", "1000", True), ("1\\,000", "#### 1,000", True), ("1 000 000", "1000000", True),
    ("27.0", 27.0, True), ("27", "27.0", True), ("0.5", "\\frac{1}{2}", True), ("\\frac12", "0.5", True),
    ("1/2", ".5", True), ("\\dfrac{3}{4}", "0.75", True), ("-\\frac{1}{2}", "\\frac{-1}{2}", True),
    ("\\frac{4}{2}", "2", True), ("0.75", "\\frac{3}{5}", False),
    ("50\\%", "50", True), ("50\\%", "0.5", True), ("25\\%", "\\frac{1}{4}", True), ("500\\%", "5", True),
    ("5%", "0.05", True),
    ("12 €", "12", True), ("\\$12", "12", True), ("7.5 m^2", "7.5", True),
    # square roots and degrees (the fast path's second round)
    ("\\sqrt{4}", "2", True), ("\\sqrt{12}", "2\\sqrt{3}", True), ("2 \\sqrt{5}", "2\\sqrt{5}", True),
    ("\\frac{\\sqrt3}{3}", "\\frac{\\sqrt{3}}{3}", True), ("\\dfrac{3\\sqrt{3}}{4}", "\\frac{3\\sqrt{3}}{4}", True),
    ("\\sqrt{54}", "\\sqrt{53}", False), ("-\\sqrt{3}", "\\sqrt{3}", False), ("11\\sqrt2", "11\\sqrt{2}", True),
    ("\\sqrt{3}", "2", False), ("30^\\circ", "30", True), ("30", "30^\\circ", True), ("120^{\\circ}", "120^\\circ", True),
    ("121^\\circ", "120^\\circ", False),
]


@pytest.mark.parametrize("answer, gold, correct", CASES)
def test_hand_checked_cases_are_decided_and_agree(answer, gold, correct):
    response = "So the answer is \\boxed{%s}." % answer
    quick = fast(response, gold)
    assert quick is not None, (answer, gold)
    assert quick["correct"] is correct
    assert quick == full(response, gold)


UNDECIDED = [
    # too close to math-verify's rounding, not a plain number, or ambiguous: the workers decide
    ("0.5000004", "0.5"), ("0.333333", "\\frac{1}{3}"), ("0.1234567", "0.1234568"),
    ("5.", "5"), ("1e5", "100000"), ("x = 5", "5"), ("30°", "30^\\circ"), ("2,74", "2.74"),
    ("\\sqrt{2}", "1.414214"), ("\\sqrt{3}2", "2\\sqrt{3}"),
    ("\\sqrt{10000000001}", "\\sqrt{10000000000}"), ("\\sqrt{4}\\%", "2\\%"), ("0.5^\\circ", "0.5"),
    ("\\frac{1}{0}", "1"), ("-50\\%", "-50"), ("\\frac{1}{2}\\%", "0.005"), ("(1, 2)", "1"), ("2 3", "23"),
    ("12345678901.5", "12345678901.5"), ("0.1234567890123456", "0.1234567890123456"),
    ("12.5\\%", "12.5"),  # a fractional percentage has two readings since issue 41 (it is right): workers
    ("25.0\\%", "25"),  # so has one with a decimal point (right, as 25% is; session 15): workers
]


@pytest.mark.parametrize("answer, gold", UNDECIDED)
def test_what_the_fast_path_leaves_to_the_workers(answer, gold):
    response = "\\boxed{%s}" % answer
    assert fast(response, gold) is None


def test_golds_that_are_not_plain_numbers_skip_the_fast_path():
    for gold in ("\\sqrt{-2}", "x^2+1", "(1, 2)", "\\text{odd}", "2,74", "1, 2", "\\frac{1}{0}", "", None):
        assert gold_number(gold) is None, gold
        assert exact_verdict("\\boxed{1}", gold) is None


def test_no_answer_against_a_number_gold_is_decided():
    for response in ("I am not sure.", "The answer is \\boxed{}.", "", "\\boxed{\\frac{1}{"):
        assert fast(response, "42") == full(response, "42") == {"correct": False, "extracted": None,
                                                                   "gold_parsed": True}


def test_the_number_model():
    assert exact_number("0.5", gold=True) == ExactNumber("rational", Fraction(1, 2))
    assert exact_number("0.5") == ExactNumber("float", Fraction(1, 2))
    assert exact_number("50\\%") == ExactNumber("int", Fraction(50), percent=True)
    assert exact_number("\\frac{6}{3}") == ExactNumber("int", Fraction(2))
    assert numbers_equal(ExactNumber("int", Fraction(50)), ExactNumber("int", Fraction(50), True)) is True
    assert numbers_equal(ExactNumber("float", Fraction(1, 3)), ExactNumber("rational", Fraction(1, 3))) is True
    assert numbers_equal(ExactNumber("float", Fraction(1, 2)), ExactNumber("float", Fraction(500001, 10 ** 6))) is None


@pytest.mark.parametrize("hostile", [
    "\\boxed{" + "9" * 100_000 + "}",
    "The answer is " + "1," * 50_000 + "1.",
    "\\boxed{" + "\\frac{1}{" * 20_000 + "}" * 20_000 + "}",
    "#### " + "1" * 5000 + "/" + "7" * 5000,
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{" + "1" * 60 + "." + "1" * 60 + "}",
])
def test_hostile_answers_cost_little(hostile):
    """Each goes to the workers (and their time limit), or states no answer the extraction accepts
    (a box of 100,000 characters is not a final answer): wrong, as the full path says."""
    t0 = time.perf_counter()
    for require_anchor in (True, False):
        verdict = exact_verdict(hostile, "42", require_anchor)
        assert verdict is None or verdict == {"correct": False, "extracted": None, "gold_parsed": True}
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("hostile", [
    "\\boxed{" + "1+" * 50_000 + "1}",
    "\\boxed{(" + "1," * 50_000 + "1)}",
    "\\boxed{\\sqrt{" + "9" * 100_000 + "}}",
    "\\boxed{" + "\\sqrt{2}+" * 10_000 + "1}",
    "\\boxed{\\sqrt{99999989}+\\sqrt{99999971}-1}",  # two large primes: the most trial division
    "\\boxed{" + "{" * 30 + "1+2" + "}" * 30 + "}",
])
def test_hostile_sums_tuples_and_roots_cost_little(hostile):
    """The later shapes stay bounded: too long, they state no final answer or go to the workers;
    short, they are decided in milliseconds, as the full path decides them."""
    t0 = time.perf_counter()
    verdicts = [exact_verdict(hostile, gold, require_anchor) for gold in ("42", "(1, 2)", "1+\\sqrt{2}")
                for require_anchor in (True, False)]
    assert time.perf_counter() - t0 < 2.0
    for verdict, gold in zip(verdicts[::2], ("42", "(1, 2)", "1+\\sqrt{2}")):
        if verdict is not None and len(hostile) > 2000:  # a box that long is no final answer (shared extraction)
            assert verdict == {"correct": False, "extracted": None, "gold_parsed": True}
        elif verdict is not None:
            assert verdict == full(hostile, gold)


# --- through the grader's pool -------------------------------------------------------------------------

def test_the_pool_answers_plain_numbers_without_its_workers():
    responses = ["\\boxed{%d}" % n for n in range(40)] + ["I am not sure."] * 5
    golds = [str(n if n % 3 else n + 1) for n in range(40)] + ["7"] * 5
    with MathGrader(timeout=30.0, workers=1) as grader:
        results = grader.grade_batch(responses, golds)
        stats = grader.stats()
        assert stats["workers_started"] == 0 and stats["fast_path"] == 45
        # a gold the fast path does not read (an equation) still goes to a worker, and agrees with the
        # per-sample path (a polynomial gold, x^2+1, is the fast path's since issue 41)
        mixed = grader.grade_batch(["\\boxed{y=x^2+1}", "\\boxed{3}"], ["y=x^2+1", "3"])
        assert grader.stats()["workers_started"] >= 1 and grader.stats()["fast_path"] == 46
    for response, gold, got in zip(responses, golds, results):
        want = full(response, gold)
        assert (got.correct, got.extracted, got.gold_parsed, got.timeout, got.error) == (
            want["correct"], want["extracted"], want["gold_parsed"], False, None)
    assert [r.correct for r in mixed] == [True, True]


def test_the_fast_path_can_be_switched_off_and_pickles():
    import pickle

    grader = MathGrader(fast_path=False)
    try:
        assert pickle.loads(pickle.dumps(grader)).fast_path is False
        assert MathGrader().fast_path is True
    finally:
        grader.close()
    with pytest.raises(ValueError, match="fast_path"):
        MathGrader(fast_path="yes")


# --- square roots and degrees -----------------------------------------------------------------------

SQUARES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 18, 27, 50, 53, 98, 113, 10 ** 10)


def radical_spellings(coefficient: Fraction, radicand: int, draw) -> str:
    """One spelling of ``coefficient * sqrt(radicand)`` with a square root in it."""
    sign = "-" if coefficient < 0 else ""
    p, q = abs(coefficient).numerator, abs(coefficient).denominator
    root = draw(st.sampled_from(["\\sqrt{%d}" % radicand] + (["\\sqrt%d" % radicand] if radicand < 10 else [])))
    c = "" if p == 1 else str(p)
    if q == 1:
        forms = [sign + c + root, sign + c + " " + root, "%s\\frac{%s%s}{1}" % (sign, c, root)]
    else:
        forms = ["%s\\frac{%s%s}{%d}" % (sign, c, root, q), "%s\\dfrac{%s%s}{%d}" % (sign, c, root, q),
                 "%s\\frac{%s %s}{%d}" % (sign, c, root, q)]
    return draw(st.sampled_from(forms))


@st.composite
def radical_samples(draw):
    """A gold ``r * sqrt(n)`` and an answer: the same number (another coefficient/radicand split, or a
    plain number when it is rational, or a decimal or percent, which the workers get), or a wrong one."""
    require_anchor = draw(st.booleans())
    radicand = draw(st.sampled_from(SQUARES))
    coefficient = draw(st.builds(Fraction, st.integers(-12, 12).filter(bool), st.integers(1, 6)))
    gold = radical_spellings(coefficient, radicand, draw)
    how = draw(st.sampled_from(["same", "split", "plain", "decimal", "plus1", "radicand", "neg", "near", "integer"]))
    a_coef, a_rad = coefficient, radicand
    if how == "split":
        k = draw(st.sampled_from([2, 3]))
        a_coef, a_rad = coefficient / k, radicand * k * k
    elif how == "plus1":
        a_coef = coefficient + 1 if coefficient != -1 else Fraction(2)
    elif how == "radicand":
        a_rad = radicand + 1
    elif how == "neg":
        a_coef = -coefficient
    elif how == "near":
        a_rad = radicand * 10 ** 10 + 1
        a_coef = coefficient / 10 ** 5
    if how == "plain" or how == "decimal" or how == "integer":
        root = math.isqrt(radicand)
        value = coefficient * root if root * root == radicand else None
        if how == "integer" or value is None:
            answer = spellings(Fraction(draw(st.integers(-20, 20))) if value is None else value, draw)
        elif how == "plain":
            answer = spellings(value, draw)
        else:
            answer = format(float(coefficient) * math.sqrt(radicand), ".7f")
    else:
        answer = radical_spellings(a_coef, a_rad, draw)
    gold = draw(st.sampled_from([gold, "$%s$" % gold, "So it is $\\boxed{%s}$." % gold]))
    if draw(st.booleans()):  # the gold as a plain number, the answer with a root
        gold, answer = (spellings(Fraction(draw(st.integers(-20, 20))), draw),
                        radical_spellings(a_coef, a_rad, draw))
    return wrap(answer, draw, require_anchor), gold, require_anchor


@st.composite
def degree_samples(draw):
    require_anchor = draw(st.booleans())
    value = draw(st.integers(-360, 720))
    answer_value = value if draw(st.booleans()) else value + draw(st.sampled_from([1, -1, 180, 360]))
    marks = ["^\\circ", "^{\\circ}", " ^\\circ", "^{ \\circ }", "", "°", "\\text{ degrees}"]
    gold = "%d%s" % (value, draw(st.sampled_from(marks)))
    answer = "%d%s" % (answer_value, draw(st.sampled_from(marks)))
    return wrap(answer, draw, require_anchor), draw(st.sampled_from([gold, "$%s$" % gold])), require_anchor


RADICALS_DECIDED = []


@NEW_PROPERTY
@given(st.one_of(radical_samples(), degree_samples()))
def test_roots_and_degrees_equal_the_full_path(sample):
    response, gold, require_anchor = sample
    quick = fast(response, gold, require_anchor)
    if quick is None:
        return
    RADICALS_DECIDED.append(quick["correct"])
    assert quick == full(response, gold, require_anchor), (response, gold, require_anchor)


def test_the_roots_property_decides_most_of_what_it_generates():
    decided = []

    @PROPERTY
    @given(st.one_of(radical_samples(), degree_samples()))
    def collect(sample):
        quick = fast(*sample)
        if quick is not None:
            decided.append(quick["correct"])

    collect()
    assert len(decided) >= 120 and 30 <= sum(decided) <= len(decided) - 30, (len(decided), sum(decided))


@NEW_PROPERTY
@given(radical_samples())
def test_roots_agree_with_real_math_verify(sample):
    """On roots math-verify reads as the grader does (braced, no units), real math-verify agrees."""
    response, gold, _ = sample
    answer = find_answer_candidate(response)
    gold_text = prepare_gold(gold)
    assume(answer is not None and gold_text is not None)
    assume(all("\\sqrt{" in t or "\\sqrt" not in t for t in (answer.raw, gold_text)))
    assume(not any(s in t for t in (answer.raw, gold_text) for s in ("~", "\\,", "{,}", "cm", "€", "\\$", ",", "m^2")))
    quick = fast("\\boxed{%s}" % answer.raw, gold)
    if quick is not None:
        assert quick["correct"] == reference("$%s$" % gold_text, "\\boxed{%s}" % answer.raw), (answer.raw, gold_text)


# --- multiples of pi and tuples ---------------------------------------------------------------------

def pi_spellings(coefficient: Fraction, draw) -> str:
    sign = "-" if coefficient < 0 else ""
    p, q = abs(coefficient).numerator, abs(coefficient).denominator
    c = "" if p == 1 else str(p)
    if q == 1:
        forms = [sign + c + "\\pi", sign + c + " \\pi", "%s\\frac{%s\\pi}{1}" % (sign, c)]
    else:
        forms = ["%s\\frac{%s\\pi}{%d}" % (sign, c, q), "%s\\dfrac{%s\\pi}{%d}" % (sign, c, q),
                 "%s\\frac{%s \\pi}{%d}" % (sign, c, q)]
    return draw(st.sampled_from(forms))


# an element: (kind, coefficient, radicand); its value is coefficient * sqrt(radicand), or * pi
elements = st.one_of(
    st.tuples(st.just("number"), st.integers(-30, 30).map(Fraction), st.just(1)),
    st.tuples(st.just("number"), st.builds(Fraction, st.integers(-9, 9), st.integers(2, 7)), st.just(1)),
    st.tuples(st.just("root"), st.builds(Fraction, st.integers(-9, 9).filter(bool), st.integers(1, 4)),
              st.sampled_from([2, 3, 5, 8, 12])),
    st.tuples(st.just("pi"), st.builds(Fraction, st.integers(-9, 9).filter(bool), st.integers(1, 6)), st.just(1)),
)


def element_spelling(element, draw) -> str:
    kind, coefficient, radicand = element
    if kind == "root":
        return radical_spellings(coefficient, radicand, draw)
    if kind == "pi":
        return pi_spellings(coefficient, draw)
    text = spellings(coefficient, draw)
    assume(not any(s in text for s in (",", "\\,", "{,}", "~", " ", "\\;", "cm", "m^2", "€", "\\$", "%", ".")))
    return text


def element_twin(element, draw):
    kind, coefficient, radicand = element
    how = draw(st.sampled_from(["same", "same", "plus1", "neg", "kind"]))
    if how == "plus1":
        return kind, coefficient + 1 if coefficient != -1 else Fraction(3), radicand
    if how == "neg":
        return kind, -coefficient if coefficient else Fraction(1), radicand
    if how == "kind":
        return draw(elements)
    return element


def tuple_text(parts, draw) -> str:
    sep = draw(st.sampled_from([",", ", "]))
    form = draw(st.sampled_from(["(%s)", "(%s)", "\\left(%s\\right)", "\\left( %s \\right)", "[%s]", "%s", "(%s)+1"]))
    return form % sep.join(parts)


@st.composite
def tuple_samples(draw):
    require_anchor = draw(st.booleans())
    gold_elements = draw(st.lists(elements, min_size=2, max_size=4))
    how = draw(st.sampled_from(["same", "twins", "swap", "longer"]))
    answer_elements = list(gold_elements)
    if how == "twins":
        answer_elements = [element_twin(e, draw) for e in gold_elements]
    elif how == "swap":
        answer_elements = answer_elements[::-1]
    elif how == "longer":
        answer_elements.append(draw(elements))
    gold = tuple_text([element_spelling(e, draw) for e in gold_elements], draw)
    answer = tuple_text([element_spelling(e, draw) for e in answer_elements], draw)
    gold = draw(st.sampled_from([gold, "$%s$" % gold, "So it is $\\boxed{%s}$." % gold]))
    return wrap(answer, draw, require_anchor), gold, require_anchor


@st.composite
def pi_samples(draw):
    require_anchor = draw(st.booleans())
    gold = draw(elements.filter(lambda e: e[0] == "pi"))
    answer = element_twin(gold, draw) if draw(st.booleans()) else gold
    answer_text = element_spelling(answer, draw)
    if draw(st.integers(0, 5)) == 0:
        answer_text = format(float(answer[1]) * math.pi, ".6f")  # a decimal: the workers'
    return wrap(answer_text, draw, require_anchor), element_spelling(gold, draw), require_anchor


TUPLES_DECIDED = []


@NEW_PROPERTY
@given(st.one_of(tuple_samples(), pi_samples()))
def test_tuples_and_pi_equal_the_full_path(sample):
    response, gold, require_anchor = sample
    quick = fast(response, gold, require_anchor)
    if quick is None:
        return
    TUPLES_DECIDED.append(quick["correct"])
    assert quick == full(response, gold, require_anchor), (response, gold, require_anchor)


def test_the_tuples_property_decides_enough_of_what_it_generates():
    decided = []

    @PROPERTY
    @given(st.one_of(tuple_samples(), pi_samples()))
    def collect(sample):
        quick = fast(*sample)
        if quick is not None:
            decided.append(quick["correct"])

    collect()
    assert len(decided) >= 80 and 25 <= sum(decided) <= len(decided) - 25, (len(decided), sum(decided))


TUPLE_CASES = [
    ("(8,-2)", "(8,-2)", True), ("(8, -2)", "(8,-2)", True), ("\\left(8,-2\\right)", "(8,-2)", True),
    ("(8,-3)", "(8,-2)", False), ("(2,5)", "(2,4)", False), ("(1,-16,-4,44)", "(1,-16,-4,43)", False),
    ("(\\frac32,-13)", "\\left( \\frac{3}{2}, -13 \\right)", True), ("(-\\sqrt{3},\\sqrt{3})", "(-\\sqrt{3}, \\sqrt{3})", True),
    ("13\\pi", "12\\pi", False), ("\\frac{-\\pi}{6}", "-\\frac{\\pi}{6}", True), ("\\frac{2\\pi}{4}", "\\frac{\\pi}{2}", True),
    ("12", "12\\pi", False), ("8\\pi", "8 \\pi", True),
    # left to the workers: a set, an interval read against a pair, decimals, other lengths, infinity
    ("8,-2", "(8,-2)", None), ("(-2,8)", "(8,-2)", None), ("(1.5,-13)", "(\\frac{3}{2},-13)", None),
    ("(1,2,3)", "(1,2)", None), ("(3,\\infty)", "(2,\\infty)", False), ("[2,4]", "(2,4)", None),
]


@pytest.mark.parametrize("answer, gold, correct", TUPLE_CASES)
def test_tuples_and_pi_hand_checked(answer, gold, correct):
    response = "So the answer is \\boxed{%s}." % answer
    quick = fast(response, gold)
    if correct is None:
        assert quick is None
    else:
        assert quick is not None and quick["correct"] is correct
        assert quick == full(response, gold)


# --- sums of exact terms ----------------------------------------------------------------------------

def sum_text(parts, draw) -> str:
    """``parts`` = [(element, negate)]: written as a sum, ``a+b``, ``a - b``, a leading minus."""
    out = ""
    for i, (element, negate) in enumerate(parts):
        text = element_spelling((element[0], abs(element[1]), element[2]), draw)
        negative = (element[1] < 0) != negate
        sep = draw(st.sampled_from(["", " "]))
        out += ((sep + "-" + sep) if negative else (sep + "+" + sep if i else "")) + text
    return out


@st.composite
def sum_samples(draw):
    require_anchor = draw(st.booleans())
    parts = draw(st.lists(st.tuples(elements.filter(lambda e: e[1] != 0), st.just(False)), min_size=1, max_size=3))
    how = draw(st.sampled_from(["same", "reordered", "plus1", "negated", "other"]))
    answer = list(parts)
    if how == "reordered":
        answer = answer[::-1]
    elif how == "plus1":
        answer = answer + [(("number", Fraction(1), 1), False)]
    elif how == "negated":
        answer = [(e, True) for e, _ in answer]
    elif how == "other":
        answer = [(element_twin(e, draw), n) for e, n in answer]
        assume(all(e[1] != 0 for e, _ in answer))
    gold = sum_text(parts, draw)
    gold = draw(st.sampled_from([gold, "$%s$" % gold, "So it is $\\boxed{%s}$." % gold]))
    return wrap(sum_text(answer, draw), draw, require_anchor), gold, require_anchor


SUMS_DECIDED = []


@NEW_PROPERTY
@given(sum_samples())
def test_sums_equal_the_full_path(sample):
    response, gold, require_anchor = sample
    quick = fast(response, gold, require_anchor)
    if quick is None:
        return
    SUMS_DECIDED.append(quick["correct"])
    assert quick == full(response, gold, require_anchor), (response, gold, require_anchor)


def test_the_sums_property_decides_most_of_what_it_generates():
    decided = []

    @PROPERTY
    @given(sum_samples())
    def collect(sample):
        quick = fast(*sample)
        if quick is not None:
            decided.append(quick["correct"])

    collect()
    assert len(decided) >= 120 and 30 <= sum(decided) <= len(decided) - 30, (len(decided), sum(decided))


SUM_CASES = [
    ("\\frac{1}{2}+1", "\\frac{3}{2}", True), ("\\frac{1}{2}+1", "2", False), ("2\\sqrt{3}+1", "1+2\\sqrt{3}", True),
    ("1+\\sqrt{12}", "1+2\\sqrt{3}", True), ("1-2\\sqrt{3}", "1+2\\sqrt{3}", False), ("2\\pi+18", "18+2\\pi", True),
    ("18+2\\pi+1", "18+2\\pi", False), ("\\sqrt{2}-\\sqrt{2}", "0", True), ("-1-2", "-3", True),
    ("326.5+1", "326.5", False), ("1+-2", "-1", None), ("50\\%+1", "1.5", None), ("-+1+1", "-1+1", None),
    ("- 1+1", "0", True),
]


@pytest.mark.parametrize("answer, gold, correct", SUM_CASES)
def test_sums_hand_checked(answer, gold, correct):
    response = "So the answer is \\boxed{%s}." % answer
    quick = fast(response, gold)
    if correct is None:
        assert quick is None
    else:
        assert quick is not None and quick["correct"] is correct
        assert quick == full(response, gold)

"""The grader's fast path: verdicts on plain numbers decided exactly, without math-verify.

Most RL math data (GSM8K, AIME, AMC, much of DAPO-Math and OpenR1-Math) has integer or simple
rational golds, and models answer them with numbers. For those the worker round trip and
sympy are pure cost: :func:`exact_verdict` decides them in the calling process, with
:class:`fractions.Fraction`, and returns exactly what the worker
(:func:`~rlhf_ext.rewards.math_verify_recipe.grade_response`) would return -- or ``None``, and the
sample goes to the workers as before. It never changes a verdict: it only answers when it is
certain what math-verify 0.9 would say.

What it reads: the final answer found by the grader's own extraction
(:func:`~rlhf_ext.rewards.extraction.find_answer_candidate`), after the grader's own rewriting
(:func:`~rlhf_ext.rewards.extraction.answer_readings`: joined digit groups, units dropped, operator
arguments braced), on the answer and on the gold alike, when each has exactly one reading (a decimal
comma ``2,74`` has two: workers) and that reading is, in full, one of

* an integer: ``42``, ``-7``, ``+5``, ``025``, comma thousands ``1,000`` / ``12,345,678``;
* a decimal: ``0.5``, ``.5``, ``-2.75``, ``1,000.5`` (at most 15 significant digits);
* a fraction of integers: ``\\frac{3}{4}``, ``-\\frac{1}{2}``, ``\\frac{-1}{2}`` (``\\dfrac``,
  ``\\tfrac``, ``\\frac34`` after bracing), ``3/4``, ``-3/4``; a zero denominator is not;
* a non-negative integer or decimal percentage: ``50\\%``, ``12.5%``;
* an integer in degrees written ``30^\\circ`` or ``30^{\\circ}`` (math-verify's normalization drops
  the degree mark: 30; ``30°`` is not dropped: workers);
* a rational times a square root or pi, as a single term: ``\\sqrt{3}``, ``-2\\sqrt{3}``,
  ``2 \\sqrt{5}``, ``\\frac{3\\sqrt{3}}{4}``, ``\\dfrac{\\sqrt{3}}{3}``, ``12\\pi``,
  ``-\\frac{\\pi}{6}`` (sympy's exact ``Rational * sqrt(n)`` / ``Rational * pi``);
* a sum of up to 6 such terms and integers or fractions: ``1+2\\sqrt{3}``, ``18+2\\pi``,
  ``\\frac{1}{2}+1``, ``\\sqrt{2}-1`` (radicands up to 1e8, reduced to their square-free part);
* a parenthesised tuple of 2 to 8 of those exact numbers (no decimals or percentages):
  ``(8,-2)``, ``\\left( \\frac{3}{2}, -13 \\right)``, ``(-\\sqrt{3}, \\sqrt{3})``;
* exact arithmetic on those (issue 41), read by :mod:`.exact_expressions`' parser (never evaluated):
  ``(\\frac{1}{2})+1``, ``-(2)``, ``\\frac{1+\\sqrt{5}}{2}``, ``\\frac{1}{\\sqrt{3}}``, ``2\\cdot 3``,
  ``\\frac{1}{2}\\pi``, ``1/2/3``; with a decimal in it only decided wrong, far from the gold;
* mixed numbers and LaTeX-spaced digit groups (:mod:`.exact_mixed`): ``137 \\frac{1}{2}``, ``10,\\!080``;
* each only against its own kind: a set of up to 8 exact numbers (:mod:`.exact_sets`): ``\\{1, -2\\}``;
  a polynomial over the rationals in single letters, by exact expansion (:mod:`.exact_polynomials`):
  ``x^3+3x-6``; an interval or union of intervals, as sets of reals (:mod:`.exact_intervals`):
  ``(0,9) \\cup (9,36)``; a matrix or vector of exact numbers (:mod:`.exact_matrices`).

Anything else -- ``5.``, ``1e5``, ``x = 5``, ``\\text{5}``, ``$5$``, ``2(3)``, ``\\sqrt{3}2``, a set
against a tuple, spaces inside a number -- goes to the workers.

Roots, pi, sums and tuples (:class:`ExactSum`, :func:`exact_tuple`) compare as sympy does for exact numbers:
equal values are equal (square roots of distinct square-free numbers and pi are linearly independent over
the rationals, so term-by-term equality is value equality); values more than 2e-6 apart are not; closer,
or against a ``Float`` or a percentage: workers. Tuples compare element by element, a pair only when both
are read alike (an increasing pair is an open interval to math-verify); different lengths: workers.

How math-verify 0.9 compares two such numbers (``math_verify.grader.sympy_expr_eq`` and
``sympy_numeric_eq``, read in the installed package; each rule below is pinned by the property tests
in ``tests/test_rewards_fast_path.py`` against the worker's code and real math-verify):

* latex2sympy reads an integer or a fraction of integers as an exact ``Integer`` / ``Rational`` (a
  fraction that divides out, ``\\frac{4}{2}``, is an ``Integer``), a decimal as a ``Float``, and
  ``X\\%`` as ``X * UnevaluatedExpr(1/100)``; the gold's normalization (math-verify's default,
  ``nits=True``) reads a gold of exactly ``0.5`` or ``.5`` as ``\\frac{1}{2}``;
* when either side is a ``Float`` (or a percentage of one), both are rounded to 6 decimals
  (``float_rounding=6``) and compared: ``0.333333`` equals ``\\frac{1}{3}``, ``0.5000004`` equals
  ``0.5``. The fast path decides such a pair only when the exact values are equal (correct) or
  differ by more than 2e-6 (wrong: rounding moves each by at most 5e-7), with magnitudes below 1e9;
  anything closer goes to the workers;
* when both are integers or percentages of integers, the numbers before the percent sign are
  compared: ``50\\%`` equals ``50`` (and a gold ``50`` accepts ``50\\%``);
* otherwise the exact values are compared, and sympy's ``simplify(gold - answer)`` decides last:
  ``\\frac{1}{4}`` equals ``25\\%``, ``500\\%`` equals ``5`` (a decimal percentage, ``25.0\\%``, has
  two readings since issue 41: the workers).

The deliberate differences of the grader from math-verify (``1\\,000`` and ``1 000`` are 1000,
``7.5 m^2`` is 7.5, a decimal comma has two readings) come from the shared rewriting, so the fast
path keeps them. Everything here is bounded string work on at most :data:`MAX_FAST_CHARS`
characters of answer (plus the linear extraction the caller does anyway): a hostile answer costs
microseconds and then goes to the workers, where the time limit applies.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Dict, Optional

from .exact_expressions import expression_value, square_free
from .exact_intervals import ExactIntervals, exact_intervals, intervals_equal
from .exact_matrices import ExactMatrix, exact_matrix, matrices_equal
from .exact_mixed import mixed_number, ungrouped
from .exact_near_misses import number_plus_number, structure_plus_number
from .exact_polynomials import polynomial_value
from .exact_sets import ExactSet, exact_set, sets_equal
from .answer_forms import rounding_digits
from .extraction import answer_readings, find_answer_candidate, normalize_answer

# A number the fast path reads is short; longer answers are not even looked at.
MAX_FAST_CHARS = 120
_MAX_DIGITS = 60
# Float comparisons are decided only away from math-verify's rounding to 6 decimals, and only where
# a 15-digit Float holds the value exactly enough for that rounding.
_FLOAT_MARGIN = Fraction(2, 10 ** 6)
_FLOAT_MAX = 10 ** 9
_FLOAT_DIGITS = 15

_INT = r"(?:\d{1,%d}|[1-9]\d{0,2}(?:,\d{3}){1,19})" % _MAX_DIGITS
_INTEGER = re.compile(r"([+-]?)(" + _INT + r")")
_DECIMAL = re.compile(r"([+-]?)(" + _INT + r")?\.(\d{1,%d})" % _FLOAT_DIGITS)
_FRACTION = re.compile(r"(-?)\\[dtc]?frac\{(-?)(\d{1,%d})\}\{(\d{1,%d})\}" % (_MAX_DIGITS, _MAX_DIGITS))
_SLASH = re.compile(r"(-?)(\d{1,%d})/(\d{1,%d})" % (_MAX_DIGITS, _MAX_DIGITS))
_PERCENT = re.compile(r"(.+?)(?:\\%|%)")
# A degree sign written as a LaTeX superscript after a number: math-verify's normalization drops it
# (``30^\\circ`` is 30); the Unicode sign is not dropped (``30°`` is no number there): workers.
_DEGREES = re.compile(r"(.+?)\^(?:\\circ|\{\\circ\})")
# A square root with a rational coefficient: ``\sqrt{3}``, ``-2\sqrt{3}``, ``2 \sqrt{5}``,
# ``\frac{3\sqrt{3}}{4}``, ``-\dfrac{\sqrt{3}}{3}`` (after bracing: ``11\sqrt2``, ``\frac{\sqrt3}2``).
_RADICAND_DIGITS = 12
_SQRT = r"(?:([1-9]\d{0,%d})\s*)?\\sqrt\{([1-9]\d{0,%d})\}" % (_RADICAND_DIGITS - 1, _RADICAND_DIGITS - 1)
_RADICAL = re.compile(r"(-?)" + _SQRT)
# A rational multiple of pi: ``\pi``, ``12\pi``, ``8 \pi``, ``-\frac{\pi}{6}``, ``\dfrac{5\pi}{4}``.
_PI = r"(?:([1-9]\d{0,%d})\s*)?\\pi(?![A-Za-z])" % (_RADICAND_DIGITS - 1)
_PI_MULTIPLE = re.compile(r"(-?)" + _PI)
_PI_FRACTION = re.compile(r"(-?)\\[dt]?frac\{" + _PI + r"\}\{([1-9]\d{0,%d})\}" % (_RADICAND_DIGITS - 1))
# A tuple of numbers: ``(8,-2)``, ``\left( \frac{3}{2}, -13 \right)``, ``(1,-16,-4,43)``.
_TUPLE = re.compile(r"\(([^()]*)\)")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_TUPLE_ELEMENT = re.compile(r"-?(?:0|[1-9]\d*)(?:/[1-9]\d*)?|-?\\[dt]?frac\{.*\}\{.*\}|-?\d*\s*\\(?:sqrt|pi).*")
_MAX_TUPLE = 8
_RADICAL_FRACTION = re.compile(r"(-?)\\[dt]?frac\{" + _SQRT + r"\}\{([1-9]\d{0,%d})\}" % (_RADICAND_DIGITS - 1))


@dataclass(frozen=True)
class ExactNumber:
    """How math-verify holds a number: ``kind`` "int" (sympy Integer), "rational", "float" or
    "radical" (``value * sqrt(radicand)``, written with a square root, or ``value * pi`` when ``pi``);
    ``value`` the number written (before a percent sign), exactly; ``percent`` whether ``X%``;
    ``radicand`` 1 unless a square root is written."""

    kind: str
    value: Fraction
    percent: bool = False
    radicand: int = 1
    pi: bool = False

    @property
    def effective(self) -> Fraction:
        """The value math-verify's ``doit()`` gives (a percentage divided by 100); for a "radical", the
        coefficient of its square root."""
        return self.value / 100 if self.percent else self.value

    def signed_square(self) -> Fraction:
        """``sign(x) * x**2`` of the number's exact value: two numbers with square roots are equal
        exactly when these are."""
        v = self.effective
        return (1 if v >= 0 else -1) * v * v * self.radicand

    def approx(self) -> float:
        return float(self.effective) * math.sqrt(self.radicand) * (math.pi if self.pi else 1.0)


def _digits(s: str) -> str:
    return s.replace(",", "")


def _plain_number(text: str, gold: bool) -> Optional[ExactNumber]:
    m = _INTEGER.fullmatch(text)
    if m:
        value = int(_digits(m.group(2)))
        return ExactNumber("int", Fraction(-value if m.group(1) == "-" else value))
    m = _DECIMAL.fullmatch(text)
    if m:
        whole, frac = _digits(m.group(2) or ""), m.group(3)
        significant = (whole + frac).lstrip("0")
        if len(significant) > _FLOAT_DIGITS:
            return None
        value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac), 10 ** len(frac))
        if m.group(1) == "-":
            value = -value
        # math-verify's default (gold) normalization, nits=True: ".5" -> "0.5" -> "\frac{1}{2}"
        if gold and text in ("0.5", ".5"):
            return ExactNumber("rational", value)
        return ExactNumber("float", value)
    for pattern in (_FRACTION, _SLASH):
        m = pattern.fullmatch(text)
        if m:
            if pattern is _FRACTION:
                negative = (m.group(1) == "-") != (m.group(2) == "-")
                num, den = int(m.group(3)), int(m.group(4))
            else:
                negative = m.group(1) == "-"
                num, den = int(m.group(2)), int(m.group(3))
            if den == 0:
                return None  # zoo: math-verify compares it by its string only
            value = Fraction(-num if negative else num, den)
            return ExactNumber("int" if value.denominator == 1 else "rational", value)
    return None


# Sums of exact terms (``1+2\\sqrt{3}``, ``18+2\\pi``, ``\\frac{1}{2}+1``): a radicand is reduced to its
# square-free part by trial division, so it is kept small.
_SUM_MAX_TERMS = 6
_SUM_MAX_RADICAND = 10 ** 8


@dataclass(frozen=True)
class ExactSum:
    """A sum of exact terms, as ``(basis, coefficient)`` pairs: basis 1, ``sqrt(n)`` (``n`` square-free,
    written as the int ``n``) or pi (written as 0); sympy holds it as the same exact number."""

    terms: tuple
    kind: str = "sum"
    percent: bool = False
    # written with a decimal (math-verify: a sympy Float): only decided wrong, far from the other side
    decimal: bool = False

    def approx(self) -> float:
        return sum(float(c) * (math.pi if b == 0 else math.sqrt(b)) for b, c in self.terms)


def _square_free(n: int):
    """(k, m) with n = k*k*m and m square-free; None when n is too large to factor here."""
    return None if n > _SUM_MAX_RADICAND else square_free(n)


def _terms(number) -> Optional[Dict[int, Fraction]]:
    """The exact value of an :class:`ExactNumber` (not a Float or percentage) or :class:`ExactSum` as
    {basis: coefficient}, zero coefficients left out; None when it cannot be written so here."""
    if isinstance(number, ExactSum):
        return None if number.decimal else dict(number.terms)
    if number.kind == "float" or number.percent:
        return None
    basis, coefficient = (0 if number.pi else 1), number.value
    if number.radicand != 1:
        reduced = _square_free(number.radicand)
        if reduced is None:
            return None
        coefficient, basis = coefficient * reduced[0], reduced[1]
    return {basis: coefficient} if coefficient else {}


def _split_terms(text: str):
    """``[(sign, term), ...]`` of a sum written at the top level of ``text`` (signs outside braces)."""
    out, depth, start, sign = [], 0, 0, "+"
    for i, c in enumerate(text):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif c in "+-" and depth == 0:
            term = text[start:i].strip()
            if term:
                out.append((sign, term))
            elif i != 0:  # two signs in a row ("1+-2", "-+1"): workers
                return None
            sign, start = c, i + 1
    term = text[start:].strip()
    if not term or depth != 0:
        return None
    out.append((sign, term))
    return out


def _exact_sum(text: str) -> Optional[ExactSum]:
    parts = _split_terms(text)
    if parts is None or not 2 <= len(parts) <= _SUM_MAX_TERMS:
        return None
    total: Dict[int, Fraction] = {}
    for sign, term in parts:
        if term[0] in "+-" or "," in term or "%" in term or "circ" in term:
            return None
        number = exact_number(term)
        if number is None or isinstance(number, ExactSum):
            return None
        terms = _terms(number)
        if terms is None:
            return None
        for basis, coefficient in terms.items():
            total[basis] = total.get(basis, 0) + (-coefficient if sign == "-" else coefficient)
    return ExactSum(tuple(sorted((b, c) for b, c in total.items() if c)))


def _pi_multiple(text: str) -> Optional[ExactNumber]:
    m = _PI_MULTIPLE.fullmatch(text)
    if m:
        coefficient = Fraction(int(m.group(2) or 1))
    else:
        m = _PI_FRACTION.fullmatch(text)
        if m is None:
            return None
        coefficient = Fraction(int(m.group(2) or 1), int(m.group(3)))
    return ExactNumber("radical", -coefficient if m.group(1) == "-" else coefficient, pi=True)


def _radical(text: str) -> Optional[ExactNumber]:
    m = _RADICAL.fullmatch(text)
    if m:
        coefficient = Fraction(int(m.group(2) or 1))
        negative, radicand = m.group(1) == "-", int(m.group(3))
    else:
        m = _RADICAL_FRACTION.fullmatch(text)
        if m is None:
            return None
        coefficient = Fraction(int(m.group(2) or 1), int(m.group(4)))
        negative, radicand = m.group(1) == "-", int(m.group(3))
    return ExactNumber("radical", -coefficient if negative else coefficient, radicand=radicand)


def exact_number(reading: str, gold: bool = False) -> Optional[ExactNumber]:
    """The number one reading (:func:`answer_readings`) of an answer or gold denotes, as math-verify
    holds it, or None when it is not a plain number of the forms in the module docstring or exact
    arithmetic on them (:mod:`.exact_expressions`)."""
    if not reading or len(reading) > MAX_FAST_CHARS:
        return None
    text = reading.strip()
    found = _written_number(text, gold)
    if found is not None:
        return found
    value = expression_value(text)
    if value is None:
        return None
    return ExactSum(tuple(sorted(value[0].items())), decimal=value[1])


def _written_number(text: str, gold: bool):
    if "frac" in text and (mixed := mixed_number(text)) is not None:  # n \frac{a}{b}: :mod:`.exact_mixed`
        return ExactNumber(*mixed)
    text = ungrouped(text) or text  # 10,\!080 and 10\,080: :mod:`.exact_mixed`
    if "+" in text[1:] or "-" in text[1:]:
        found = _exact_sum(text)
        if found is not None or "{" not in text:
            return found
    if "\\sqrt" in text:
        return _radical(text)
    if "\\pi" in text:
        return _pi_multiple(text)
    if "circ" in text:
        m = _DEGREES.fullmatch(text)
        if m is None or not _INTEGER.fullmatch(m.group(1)):
            return None
        return _plain_number(m.group(1), gold)
    m = _PERCENT.fullmatch(text)
    if m:
        inner = _plain_number(m.group(1), gold=False)
        # a negative percentage parses as -1 * (X%), not as a percentage atom: workers
        if inner is None or inner.kind == "rational" or inner.value < 0 or m.group(1)[0] in "+-":
            return None
        if not (_INTEGER.fullmatch(m.group(1)) or _DECIMAL.fullmatch(m.group(1))):
            return None
        return ExactNumber(inner.kind, inner.value, percent=True)
    return _plain_number(text, gold)


def numbers_equal(gold: ExactNumber, answer: ExactNumber) -> Optional[bool]:
    """math-verify's ``verify(gold, answer)`` on two plain numbers, or None when it is too close to
    call exactly (a Float comparison near math-verify's rounding, or a magnitude where a 15-digit
    Float is not exact)."""
    if gold.kind == "sum" or answer.kind == "sum":
        return _sums_equal(gold, answer)
    if gold.kind == "radical" or answer.kind == "radical":
        return _radicals_equal(gold, answer)
    g, a = gold.effective, answer.effective
    if gold.kind == "float" or answer.kind == "float":
        if max(abs(gold.value), abs(answer.value), abs(g), abs(a)) >= _FLOAT_MAX:
            return None
        if g == a:
            return True
        if abs(g - a) > _FLOAT_MARGIN:
            return False
        return None
    if g == a:
        return True
    if gold.kind == "int" and answer.kind == "int" and gold.value == answer.value:
        return True  # 50% against 50: math-verify compares the numbers before the percent sign
    return False


def _sums_equal(gold, answer) -> Optional[bool]:
    """Sums of rationals, square roots and multiples of pi: equal term by term (square roots of distinct
    square-free numbers and pi are linearly independent over the rationals) is equal; values apart by
    more than math-verify's tolerance are not. A Float or a percentage on either side: workers."""
    if _written_with_decimal(gold) or _written_with_decimal(answer):
        return _decimals_apart(gold, answer)
    g, a = _terms(gold), _terms(answer)
    if g is None or a is None:
        return None
    if g == a:
        return True
    gv, av = gold.approx(), answer.approx()
    if max(abs(gv), abs(av)) >= _FLOAT_MAX:
        return None
    return False if abs(gv - av) > float(_FLOAT_MARGIN) * max(1.0, abs(gv), abs(av)) else None


def _written_with_decimal(number) -> bool:
    return number.decimal if isinstance(number, ExactSum) else number.kind == "float"


def _rational_value(number) -> Optional[Fraction]:
    """The rational value of a number or sum, or None (a root, pi, a percentage)."""
    if isinstance(number, ExactSum):
        if any(b != 1 for b, _ in number.terms):
            return None
        return sum((c for _, c in number.terms), Fraction(0))
    if number.percent or number.kind == "radical":
        return None
    return number.value


def _decimals_apart(gold, answer) -> Optional[bool]:
    """Arithmetic with a decimal in it (sympy Floats, compared after rounding to 6 decimals): decided only
    as wrong, when both values are rational and apart by more than the rounding can bridge; workers
    otherwise (float error in the arithmetic could move a rounding either way)."""
    g, a = _rational_value(gold), _rational_value(answer)
    if g is None or a is None or max(abs(g), abs(a)) >= _FLOAT_MAX:
        return None
    return False if abs(g - a) > _FLOAT_MARGIN else None


def _radicals_equal(gold: ExactNumber, answer: ExactNumber) -> Optional[bool]:
    """Numbers with square roots (sympy's exact ``Integer * sqrt(n)``) or pi, against each other or against
    integers and fractions: equal values are equal (``simplify(gold - answer)`` is 0); values apart by
    more than math-verify's numeric tolerance are not (``evalf(chop=True)`` of the difference is far
    from 0, and neither is a Float). A Float or a percentage on either side: workers."""
    if "float" in (gold.kind, answer.kind) or gold.percent or answer.percent:
        return None
    if gold.pi == answer.pi and gold.signed_square() == answer.signed_square():
        return True  # (pi times a nonzero rational is never a root of a rational: those stay apart)
    g, a = gold.approx(), answer.approx()
    if max(abs(g), abs(a)) >= _FLOAT_MAX:
        return None
    return False if abs(g - a) > float(_FLOAT_MARGIN) * max(1.0, abs(g), abs(a)) else None


def exact_tuple(reading: str):
    """The numbers of a reading that is a parenthesised tuple of 2 to 8 exact numbers (integers,
    fractions, roots, multiples of pi; no decimals or percentages: math-verify rounds those), or None."""
    if not reading or len(reading) > MAX_FAST_CHARS or "(" not in reading:
        return None
    m = _TUPLE.fullmatch(_LEFT_RIGHT.sub("", reading).strip())
    if m is None or "[" in m.group(1) or "\\{" in m.group(1):
        return None
    parts = [p.strip() for p in m.group(1).split(",")]
    if not 2 <= len(parts) <= _MAX_TUPLE:
        return None
    out = []
    for part in parts:
        if not _TUPLE_ELEMENT.fullmatch(part):
            return None
        number = exact_number(part)
        if number is None or number.kind == "float" or number.percent or _terms(number) is None:
            return None
        out.append(number)
    return tuple(out)


def tuples_equal(gold, answer) -> Optional[bool]:
    """math-verify on two tuples of exact numbers written alike (``(a, b)`` both): equal element by
    element is equal; one element apart is not -- when both are read the same way: a pair is an open
    interval when it increases, a tuple otherwise, so pairs whose orders differ go to the workers."""
    if len(gold) != len(answer):
        return None
    verdicts = [_sums_equal(g, a) for g, a in zip(gold, answer)]
    if all(v is True for v in verdicts):
        return True
    if len(gold) == 2:
        g0, g1, a0, a1 = (x.approx() for x in (*gold, *answer))
        if (g0 < g1) != (a0 < a1) or g0 == g1 or a0 == a1:
            return None
    if any(v is False for v in verdicts) and all(v is not None for v in verdicts):
        return False
    return None


def _only_number(text: str, gold: bool) -> Optional[ExactNumber]:
    """The number ``text`` (an answer as written, or a prepared gold) is under the grader's rewriting,
    when it has exactly one reading and that is a plain number."""
    if len(text) > MAX_FAST_CHARS:
        return None
    readings = answer_readings(text)
    if len(readings) != 1:
        return None
    return exact_number(readings[0], gold=gold)


# Verdicts are pure functions of (gold, answer as written): remembered, so the samples of a GRPO
# group that share a gold and a final answer (most of them) cost one dictionary look-up each.
_VERDICT_MEMORY = 16384
# An integer as most answers are written: one reading, itself its vote key, never a rounded decimal.
_PLAIN_INTEGER = re.compile(r"0|-?[1-9]\d{0,17}")


@lru_cache(maxsize=_VERDICT_MEMORY)
def gold_number(gold_text: str) -> Optional[ExactNumber]:
    """The number a prepared gold (:func:`~rlhf_ext.rewards.extraction.prepare_gold`) denotes, or None."""
    if not isinstance(gold_text, str):
        return None
    return _only_number(gold_text, gold=True)


@lru_cache(maxsize=_VERDICT_MEMORY)
def gold_value(gold_text: str):
    """:func:`gold_number`, else the tuple, set, polynomial (``{monomial: coefficient}``), intervals or matrix
    of exact numbers its one reading is (the kinds of :data:`_STRUCTURED`), else None."""
    number = gold_number(gold_text)
    if number is not None or not isinstance(gold_text, str):
        return number
    reading = _sole(answer_readings(gold_text) if len(gold_text) <= MAX_FAST_CHARS else ())
    if reading is None:
        return None
    return (exact_tuple(reading) or exact_set(reading, _set_element) or polynomial_value(reading)
            or exact_intervals(reading, _set_element, gold=True) or exact_matrix(reading, _set_element))


def _one_reading_plus(raw: str):
    """:func:`~.exact_near_misses.number_plus_number` of the answer's one reading, or None."""
    readings = answer_readings(raw) if len(raw) <= MAX_FAST_CHARS and ")" in raw else ()
    return number_plus_number(readings[0], exact_number) if len(readings) == 1 else None


def _sole(readings) -> Optional[str]:
    """The one reading, or a matrix's when the other is the grader's tuple spelling of its column vector."""
    if len(readings) == 1 or (len(readings) == 2 and readings[0].lstrip().startswith("\\begin{")):
        return readings[0]
    return None


def _set_element(text: str) -> Optional[Dict[int, Fraction]]:
    """An element of a set (:mod:`.exact_sets`): its exact terms, or None (a decimal, a percentage...)."""
    number = exact_number(text)
    if number is None or number.kind == "float" or number.percent:
        return None
    return _terms(number)


# a structured gold's kind: (the answer's reading of that kind, math-verify's comparison)
_STRUCTURED = {
    tuple: (exact_tuple, tuples_equal),
    ExactSet: (lambda r: exact_set(r, _set_element), sets_equal),
    dict: (polynomial_value, lambda gold, answer: answer == gold),  # polynomials: equal when expanded alike
    ExactIntervals: (lambda r: exact_intervals(r, _set_element, gold=False), intervals_equal),
    ExactMatrix: (lambda r: exact_matrix(r, _set_element), matrices_equal),
}


@lru_cache(maxsize=_VERDICT_MEMORY)
def _decide(gold_text: str, raw: str):
    """(correct, vote key) of the final answer ``raw`` against the gold, or None: workers (a wrong
    answer written as a rounded decimal included: :func:`answer_verdict`)."""
    gold = gold_value(gold_text)
    if gold is None:
        return None
    if type(gold) is ExactNumber and gold.kind == "int" and not gold.percent and _PLAIN_INTEGER.fullmatch(raw):
        return int(raw) == gold.value, raw  # what the rest reads from it, without its rewriting passes
    if type(gold) in _STRUCTURED:  # each only against its own kind (a set against a tuple: the workers)
        read, equal = _STRUCTURED[type(gold)]
        reading = _sole(answer_readings(raw)) if len(raw) <= MAX_FAST_CHARS else None
        answer = read(reading) if reading is not None else None
        correct = equal(gold, answer) if answer is not None else None
        if correct is None and reading is not None and type(gold) is not dict:  # "(gold)+1": .exact_near_misses
            correct = structure_plus_number(reading, read)
    else:
        answer = _only_number(raw, gold=False)
        if answer is None and (plus := _one_reading_plus(raw)) is not None:
            answer = ExactNumber(*plus)
        correct = numbers_equal(gold, answer) if answer is not None else None
    if correct is None:
        return None
    if not correct and rounding_digits(raw) is not None:
        return None  # a rounded decimal is also compared at its places (issue 41): the workers do that
    return correct, normalize_answer(raw) or None


def clear_caches() -> None:
    """Forget every remembered gold, verdict, label and answer search (a benchmark's cold start)."""
    from . import extraction

    for cached in (gold_number, gold_value, _decide):
        cached.cache_clear()
    extraction.clear_caches()


def answer_verdict(gold_text: str, raw: str, gold: Optional[ExactNumber] = None) -> Optional[Dict]:
    """:func:`exact_verdict` for a final answer already found (``raw``, as written in the response)."""
    if gold is None:
        gold = gold_value(gold_text)
        if gold is None:
            return None
    if len(raw) > MAX_FAST_CHARS:  # never a plain number; and not worth remembering
        return None
    decided = _decide(gold_text, raw)
    if decided is None:
        return None
    return {"correct": decided[0], "extracted": decided[1], "gold_parsed": True}


def exact_verdict(response: str, gold_text: Optional[str], require_anchor: bool = True,
                  gold: Optional[ExactNumber] = None) -> Optional[Dict]:
    """The worker's verdict (``{"correct", "extracted", "gold_parsed"}``, as
    :func:`~rlhf_ext.rewards.math_verify_recipe.grade_response` returns it) when the gold is a plain
    number and the response states no answer or a plain number; else None (grade it in full).

    ``gold``: :func:`gold_number` of ``gold_text`` when the caller has it.
    """
    if gold_text is None or not isinstance(response, str) or not isinstance(gold_text, str):
        return None
    if gold is None:
        gold = gold_value(gold_text)
        if gold is None:
            return None
    candidate = find_answer_candidate(response, require_anchor=require_anchor)
    if candidate is None:
        # the gold parses (it is a plain number), the response states nothing: wrong
        return {"correct": False, "extracted": None, "gold_parsed": True}
    return answer_verdict(gold_text, candidate.raw, gold)


__all__ = ["ExactNumber", "MAX_FAST_CHARS", "exact_number", "numbers_equal", "gold_number", "gold_value", "exact_tuple",
           "clear_caches", "tuples_equal", "answer_verdict", "exact_verdict"]

"""Polynomials with rational coefficients, read by a parser of our own and compared by exact expansion.

The fast path (:mod:`.exact_numbers`) decides numbers; this module lets it decide a gold that is a
polynomial in single-letter variables, ``x^3+3x-6``, ``15x - 80``, ``2k+2``, ``\\frac{11+9a}{20}``,
``(x+1)^2``, against an answer of the same kind: its equal spellings (``3x+x^3-6``, ``2(k+1)`` is
not read, see below) and near misses (``(x^3+3x-6)+1``, ``x^3+3x-7``). Nothing is evaluated: the text
is tokenized and read by recursive descent into ``{monomial: Fraction}``, a monomial being a sorted
tuple of ``(letter, exponent)``.

Why expansion decides math-verify's verdict: math-verify 0.9 (``math_verify.grader.sympy_expr_eq``)
calls two sympy expressions equal when they are structurally equal or ``simplify(gold - answer)`` is
0; for polynomials over the rationals both hold exactly when the expanded forms are identical, and
symbols have no numeric value that could make two different polynomials compare equal.

What latex2sympy (math-verify's LaTeX reader) does that the grammar avoids, each probed on real
math-verify 0.9 (``tests/test_rewards_exact_polynomials.py`` pins them):

* ``e`` is Euler's number, ``i`` after a space is another symbol than ``i`` after a digit (``2 i`` and
  ``2i`` differ), ``d`` before a letter makes a differential symbol (``dx``), upper-case letters are
  read lower-case (``X`` is ``x``, but ``E`` is ``e`` and ``I`` the imaginary unit): the variables are
  the lower-case letters other than ``d``, ``e``, ``i``, ``l``, ``o``;
* two letters side by side (``xy``, ``ln``) are a product, some letters before a parenthesis a
  function: refused, as are a number and a group side by side (``2(3)`` is a mixed number to it), a
  space between a coefficient and its letter, and division by anything but a nonzero rational;
* a decimal is a sympy ``Float`` (compared after rounding): refused; so is an answer in braces
  (``{x+1}`` is a set; braces inside are groups).

Grammar (at most :data:`~.exact_numbers.MAX_FAST_CHARS` characters; degree, exponent and term count
bounded, so a hostile ``(x+1)^{12}`` costs microseconds)::

    sum     := [+-] product ([+-] product)*
    product := factor (( \\cdot | \\times | * ) factor | letter-power)*   (a letter right after a number)
    factor  := integer | \\[dt]?frac{sum}{sum} | letter-power | ( sum ) [^ exponent] | \\left( sum \\right)
               [^ exponent] | { sum }
    letter-power := letter [^ exponent],  exponent := digit | { integer }
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Dict, List, Optional, Tuple

VARIABLES = frozenset("abcfghjkmnpqrstuvwxyz")
_MAX_TERMS = 16
_MAX_DEGREE = 12
_MAX_DEPTH = 8
_MAX_DIGITS = 30

Monomial = Tuple[Tuple[str, int], ...]
Polynomial = Dict[Monomial, Fraction]

_TOKEN = re.compile(r"(\s*)(?:(\d+)|\\left\(|\\right\)|(\\[dt]?frac|\\cdot|\\times)(?![A-Za-z])"
                    r"|([A-Za-z])|([-+*(){}^]))")


class _Refused(Exception):
    """Not a polynomial this parser is sure math-verify reads the same way."""


def _tokens(text: str) -> List[Tuple[str, bool]]:
    """(token, whether whitespace came before it)."""
    out, pos, text = [], 0, text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _Refused(text[pos:pos + 10])
        token = m.group(0)[len(m.group(1)):]
        token = {"\\left(": "(", "\\right)": ")"}.get(token, token)
        if len(token) == 1 and token.isalpha() and token not in VARIABLES:
            raise _Refused(f"the letter {token!r}")
        out.append((token, bool(m.group(1))))
        pos = m.end()
    return out


def _clean(p: Polynomial) -> Polynomial:
    out = {k: v for k, v in p.items() if v}
    if len(out) > _MAX_TERMS:
        raise _Refused("too many terms")
    return out


def _add(a: Polynomial, b: Polynomial, sign: int) -> Polynomial:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, Fraction(0)) + sign * v
    return _clean(out)


def _monomial_times(a: Monomial, b: Monomial) -> Monomial:
    powers = dict(a)
    for var, n in b:
        powers[var] = powers.get(var, 0) + n
    if sum(powers.values()) > _MAX_DEGREE:
        raise _Refused("degree too high")
    return tuple(sorted(powers.items()))


def _mul(a: Polynomial, b: Polynomial) -> Polynomial:
    out: Polynomial = {}
    for ka, va in a.items():
        for kb, vb in b.items():
            k = _monomial_times(ka, kb)
            out[k] = out.get(k, Fraction(0)) + va * vb
    return _clean(out)


def _power(p: Polynomial, n: int) -> Polynomial:
    out: Polynomial = {(): Fraction(1)}
    for _ in range(n):
        out = _mul(out, p)
    return out


class _Parser:
    def __init__(self, tokens: List[Tuple[str, bool]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> Tuple[Optional[str], bool]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else (None, False)

    def take(self, expected: Optional[str] = None) -> str:
        token = self.peek()[0]
        if token is None or (expected is not None and token != expected):
            raise _Refused(f"expected {expected!r}")
        self.pos += 1
        return token

    def sum(self) -> Polynomial:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Refused("nested too deep")
        sign = 1
        if self.peek()[0] in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            if self.peek()[0] in ("+", "-"):
                raise _Refused("two signs in a row")
        value = _mul({(): Fraction(sign)}, self.product())
        while self.peek()[0] in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            value = _add(value, self.product(), sign)
        self.depth -= 1
        return value

    def product(self) -> Polynomial:
        value, last = self.factor()
        while True:
            token, spaced = self.peek()
            if token in ("\\cdot", "\\times", "*"):
                self.take()
                value, last = _mul(value, self.factor()[0]), "op"
            elif token is not None and token in VARIABLES and last == "number" and not spaced:
                value, last = _mul(value, self.factor()[0]), "op"  # 15x: a coefficient and its letter
            elif token is None or token in ("+", "-", ")", "}"):
                return value
            else:  # xy, 2 x, 2(3), x(x+1), a power of a power: read otherwise by math-verify, or unsure
                raise _Refused(f"{token!r} after a factor")

    def exponent(self) -> int:
        self.take("^")
        token = self.take()
        if token == "{":
            token = self.take()
            self.take("}")
        elif len(token) > 1:
            raise _Refused("x^12 is x^1 times 2 in LaTeX")
        if not token.isdigit() or int(token) > _MAX_DEGREE:
            raise _Refused("an exponent other than a small integer")
        return int(token)

    def factor(self) -> Tuple[Polynomial, str]:
        token = self.take()
        if token.isdigit():
            if len(token) > _MAX_DIGITS:
                raise _Refused("literal too long")
            return _clean({(): Fraction(int(token))}), "number"
        if token in VARIABLES:
            n = self.exponent() if self.peek()[0] == "^" else 1
            return ({((token, n),): Fraction(1)} if n else {(): Fraction(1)}), "letter"
        if token in ("(", "{"):
            value = self.sum()
            self.take(")" if token == "(" else "}")
            if token == "(" and self.peek()[0] == "^":
                return _power(value, self.exponent()), "group"
            return value, "group"
        if token in ("\\frac", "\\dfrac", "\\tfrac"):
            self.take("{")
            num = self.sum()
            self.take("}")
            self.take("{")
            den = self.sum()
            self.take("}")
            if list(den) != [()]:
                raise _Refused("division by zero or by a letter")
            return _mul(num, {(): 1 / den[()]}), "frac"
        raise _Refused(f"unexpected {token!r}")


def polynomial_value(text: str, max_chars: int = 120) -> Optional[Polynomial]:
    """The expanded polynomial ``text`` writes (module docstring), with at least one variable, or None
    when it is no polynomial this parser is sure of (a number too: :mod:`.exact_numbers` reads those).
    Never evaluates the text."""
    if not text or len(text) > max_chars or not any(c in VARIABLES for c in text) or text.lstrip()[:1] == "{":
        return None  # (braces around the whole answer make a set: ``{x+1}`` is FiniteSet(x + 1))
    try:
        tokens = _tokens(text)
        parser = _Parser(tokens)
        value = parser.sum()
        if parser.pos != len(tokens):
            return None
    except (_Refused, ZeroDivisionError, RecursionError):
        return None
    if not any(k for k in value):
        return None  # no variable left (x - x + 1): a number, whose reading is the number path's
    return value


__all__ = ["Polynomial", "VARIABLES", "polynomial_value"]

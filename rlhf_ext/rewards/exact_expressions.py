"""Exact values of small arithmetic answers, read by a parser of our own (never evaluated as code).

The fast path (:mod:`.exact_numbers`) reads single numbers and flat sums itself; this module reads what
those readers refuse but math-verify still holds as an exact number: a parenthesised near miss
``(\\frac{1}{2})+1`` or ``\\left(16\\sqrt{3}\\right)+1``, a fraction of sums ``\\frac{1+\\sqrt{5}}{2}``,
a root in a denominator ``\\frac{1}{\\sqrt{3}}``, products ``2\\cdot 3`` / ``2\\times\\frac{1}{2}`` /
``\\frac{1}{2}\\pi``, quotients ``1/2/3``, signs ``-(2)``.

A value is a linear combination over the basis {1, sqrt(m) for square-free m > 1, pi} with
:class:`~fractions.Fraction` coefficients (``{basis: coefficient}``, basis 1 for the rationals, ``m``
for sqrt(m), 0 for pi): sympy's canonical form of the same numbers (``sqrt(12)`` is ``2*sqrt(3)``;
``1/sqrt(3)`` is ``sqrt(3)/3``), and two such values are equal exactly when their combinations are
(square roots of distinct square-free integers and pi are linearly independent over the rationals).

The grammar, read left to right by recursive descent over at most
:data:`~.exact_numbers.MAX_FAST_CHARS` characters (precedence as latex2sympy's: sign, then products and
quotients left to right, then sums)::

    sum     := [+-] product ([+-] product)*        (a sign only first in a sum or group)
    product := factor (( \\cdot | \\times | * | / ) factor | root-or-pi)*
    factor  := [+-] factor | integer | decimal | \\[dt]?frac{sum}{sum} | \\sqrt{integer} | \\pi
               | ( sum ) | \\left( sum \\right) | { sum }

What it refuses (None: the full grader decides), each because math-verify reads it otherwise or
because it is no exact number: two numbers or groups side by side (math-verify reads ``2(3)``, ``2 3``
and ``(1)(2)`` as mixed numbers, 5 / 5 / 3; ``1\\frac{4}{5}`` as 9/5), powers, factorials, any other
command or letter, commas (tuples are :func:`~.exact_numbers.exact_tuple`'s), a root of a non-integer,
pi times a root or pi squared, division by zero, by pi or by a sum, integers of more than 30 digits,
more than 8 terms. A decimal makes the value inexact for math-verify (a sympy ``Float``): the value is
marked ``decimal`` and :mod:`.exact_numbers` then only decides it wrong when far from the gold.

Pinned against real math-verify 0.9 (``parse`` + ``verify`` as the worker calls them) by the tests in
``tests/test_rewards_fast_path.py`` (hand-computed values, refusals, and a property test over MATH-500
golds with generated equal forms and near misses).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Dict, List, Optional, Tuple

_MAX_TERMS = 8
_MAX_RADICAND = 10 ** 8
_MAX_LITERAL_DIGITS = 30
_MAX_DEPTH = 12
_PI = 0

# ``\left\{`` is no group but a set brace (math-verify: a FiniteSet): not a token, so refused
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?|\.\d+)|\\left\(|\\right\)|(\\[dt]?frac|\\sqrt|\\pi|\\cdot|\\times)"
                    r"(?![A-Za-z])|([-+*/(){}]))")


class _Refused(Exception):
    """The text is not an exact number this parser is sure math-verify reads the same way."""


def _tokens(text: str) -> List[str]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _Refused(text[pos:pos + 10])
        token = m.group(0).strip()
        out.append({"\\left(": "(", "\\right)": ")"}.get(token, token))
        pos = m.end()
    return out


def square_free(n: int) -> Tuple[int, int]:
    """(k, m) with n = k*k*m, m square-free (trial division; n <= 1e8 keeps it under 1e4 steps)."""
    k, f = 1, 2
    while f * f <= n:
        while n % (f * f) == 0:
            n //= f * f
            k *= f
        f += 1
    return k, n


Value = Tuple[Dict[int, Fraction], bool]  # ({basis: coefficient}, decimal)


def _add(a: Value, b: Value, sign: int) -> Value:
    out = dict(a[0])
    for basis, c in b[0].items():
        out[basis] = out.get(basis, Fraction(0)) + sign * c
    out = {k: v for k, v in out.items() if v}
    if len(out) > _MAX_TERMS:
        raise _Refused("too many terms")
    return out, a[1] or b[1]


def _times_term(basis_a: int, basis_b: int) -> Tuple[int, int]:
    """basis_a * basis_b as (integer factor, basis)."""
    if basis_a == 1:
        return 1, basis_b
    if basis_b == 1:
        return 1, basis_a
    if _PI in (basis_a, basis_b):
        raise _Refused("pi times a root or pi squared")
    product = basis_a * basis_b
    if product > _MAX_RADICAND:
        raise _Refused("radicand too large")
    k, m = square_free(product)
    return k, m


def _mul(a: Value, b: Value) -> Value:
    out: Dict[int, Fraction] = {}
    for ba, ca in a[0].items():
        for bb, cb in b[0].items():
            k, basis = _times_term(ba, bb)
            out[basis] = out.get(basis, Fraction(0)) + ca * cb * k
    out = {k: v for k, v in out.items() if v}
    if len(out) > _MAX_TERMS:
        raise _Refused("too many terms")
    return out, a[1] or b[1]


def _inverse(b: Value) -> Value:
    """1/b for a single nonzero term: a rational, or c*sqrt(m) = sqrt(m)/(c*m) (sympy rationalizes it)."""
    terms = b[0]
    if len(terms) != 1:
        raise _Refused("division by zero or by a sum")
    (basis, c), = terms.items()
    if basis == _PI:
        raise _Refused("division by pi")
    if basis == 1:
        return {1: 1 / c}, b[1]
    return {basis: 1 / (c * basis)}, b[1]


class _Parser:
    def __init__(self, tokens: List[str]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> Optional[str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: Optional[str] = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Refused(f"expected {expected!r}")
        self.pos += 1
        return token

    def sum(self) -> Value:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Refused("nested too deep")
        value = self.product()
        while self.peek() in ("+", "-"):
            sign = 1 if self.take() == "+" else -1
            value = _add(value, self.product(), sign)
        self.depth -= 1
        return value

    def product(self) -> Value:
        value, last = self.factor()
        while True:
            token = self.peek()
            if token in ("\\cdot", "\\times", "*"):
                self.take()
                value, last = _mul(value, self.factor()[0]), "op"
            elif token == "/":
                self.take()
                value, last = _mul(value, _inverse(self.factor()[0])), "op"
            elif token in ("\\sqrt", "\\pi") and last in ("number", "frac"):
                # 2\sqrt{3}, \frac{1}{2}\pi: a coefficient before a root or pi multiplies it
                value, last = _mul(value, self.factor()[0]), "op"
            elif token is None or token in ("+", "-", ")", "}"):
                return value
            else:  # two numbers or groups side by side: math-verify reads mixed numbers (2(3) is 5)
                raise _Refused(f"{token!r} after a factor")

    def factor(self) -> Tuple[Value, str]:
        token = self.take()
        if token in ("+", "-"):
            # one sign, at the start of a sum only: math-verify reads runs of signs (``-+1+1``) and signs
            # after an operator its own way
            if self.pos != 1 and self.tokens[self.pos - 2] not in ("(", "{"):
                raise _Refused("a sign after an operator")
            if self.peek() in ("+", "-"):
                raise _Refused("two signs in a row")
            value, kind = self.factor()
            return (value if token == "+" else ({k: -v for k, v in value[0].items()}, value[1])), kind
        if token[0].isdigit() or token[0] == ".":
            return _literal(token), "number"
        if token in ("(", "{"):
            value = self.sum()
            self.take(")" if token == "(" else "}")
            return value, "group"
        if token in ("\\frac", "\\dfrac", "\\tfrac"):
            self.take("{")
            num = self.sum()
            self.take("}")
            self.take("{")
            den = self.sum()
            self.take("}")
            return _mul(num, _inverse(den)), "frac"
        if token == "\\sqrt":
            self.take("{")
            radicand = self.take()
            self.take("}")
            if not radicand.isdigit() or len(radicand) > 9 or int(radicand) > _MAX_RADICAND:
                raise _Refused("a root of something other than a small integer")
            k, m = square_free(int(radicand))
            return (({m: Fraction(k)} if k and m else {}), False), "root"
        if token == "\\pi":
            return ({_PI: Fraction(1)}, False), "pi"
        raise _Refused(f"unexpected {token!r}")


def _literal(token: str) -> Value:
    whole, _, frac = token.partition(".")
    if len(whole) + len(frac) > _MAX_LITERAL_DIGITS:
        raise _Refused("literal too long")
    value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    return ({1: value} if value else {}), bool(frac) or "." in token


def expression_value(text: str) -> Optional[Value]:
    """``({basis: coefficient}, decimal)`` of an answer written as exact arithmetic (module docstring), or
    None when it is not one this parser is sure of. Never evaluates the text."""
    if not text or "," in text or "^" in text or "!" in text:
        return None
    try:
        tokens = _tokens(text)
        if not tokens:
            return None
        parser = _Parser(tokens)
        value = parser.sum()
        if parser.pos != len(tokens):
            return None
        return value
    except (_Refused, ZeroDivisionError, RecursionError):
        return None


__all__ = ["expression_value", "square_free"]

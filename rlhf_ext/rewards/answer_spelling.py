"""LaTeX that math-verify reads wrongly, rewritten before it parses an answer or a gold.

:func:`latex_for_math_verify`: digit groups separated by LaTeX spacing or a plain space
(``1\\,000``, ``1{,}000``, ``1~000``, ``1 000``) are joined (math-verify reads ``1\\,000`` as a
product), a unit or currency around a lone number is dropped (``7.5 m^2``, ``12 €``), and
unbraced operator arguments get their braces the way TeX reads them (``\\frac12`` ->
``\\frac{1}{2}``, ``2\\sqrt3`` -> ``2\\sqrt{3}``). A decimal comma (``2,74``) has two readings
(:func:`answer_readings`). The vote key (:mod:`.answer_normalization`) is made from the same
rewritten text, so the answer a result reports is the one that was graded. Pure string work.
"""

from __future__ import annotations

import re
from typing import List, Optional

from .answer_forms import other_forms

# A thousands group separated by LaTeX spacing: thin space \, (and \! \; \: \> "\ " ~ \thinspace),
# or the {,} that keeps a comma from adding space. Groups after the first have exactly three
# digits, and the first does not start with 0, so "3{,}5" and "0{,}125" (decimal commas) and
# "2\,3" (a product) are left alone.
# A plain space groups digits too (``1 000 000``, the SI spelling): math-verify reads it as a product.
_GROUP_SEP = r"(?:\\[,!;:> ]|\\thinspace(?![A-Za-z])\s*|~|\{,\}| )"
_DIGIT_GROUPS = re.compile(r"(?<![\d.^_])([1-9]\d{0,2})((?:" + _GROUP_SEP + r"\d{3})+)(?!\d)")
_GROUP_SEP_RE = re.compile(_GROUP_SEP)
# Operators whose arguments TeX takes one token at a time when they are not braced.
_BRACED_OPERATOR = re.compile(r"\\(?:[dtc]?frac|[dt]?binom|sqrt)(?![A-Za-z])")
_CONTROL_WORD = re.compile(r"\\[A-Za-z]+")
_MAX_NESTING = 32


def join_digit_groups(s: str) -> str:
    """``1\\,000`` / ``1{,}000`` / ``1~000`` / ``1 000`` / ``12\\,345\\,678`` -> ``1000`` / ``12345678``."""
    if "\\" not in s and "~" not in s and "{," not in s and " " not in s:
        return s
    return _DIGIT_GROUPS.sub(lambda m: m.group(1) + _GROUP_SEP_RE.sub("", m.group(2)), s)


def _matching_close(s: str, open_pos: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``open_pos`` (escaped braces skipped), or -1."""
    depth = 0
    i = open_pos
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def brace_operator_arguments(s: str, _depth: int = 0) -> str:
    """Brace the arguments of ``\\frac``, ``\\dfrac``, ``\\binom``, ``\\sqrt`` ... as TeX reads them.

    TeX takes an unbraced argument one token at a time: ``\\frac12`` is ``\\frac{1}{2}``,
    ``\\frac\\pi2`` is ``\\frac{\\pi}{2}``, ``2\\sqrt3`` is ``2\\sqrt{3}``, ``\\frac123`` is
    ``\\frac{1}{2}3``. math-verify's own fix (``malformed_operators``) reads ``\\frac123`` as
    ``\\frac{1}{23}`` and rewrites any ``a/b``; this keeps what the LaTeX renders. Braced arguments
    are rewritten inside; anything that is not a token is left as written.
    """
    if "\\" not in s or _depth > _MAX_NESTING:
        return s
    out: List[str] = []
    i, n = 0, len(s)
    while i < n:
        m = _BRACED_OPERATOR.match(s, i) if s[i] == "\\" else None
        if m is None:
            if s[i] == "\\" and i + 1 < n:  # an escaped character or a control word stays whole
                w = _CONTROL_WORD.match(s, i)
                end = w.end() if w else i + 2
                out.append(s[i:end])
                i = end
            else:
                out.append(s[i])
                i += 1
            continue
        out.append(m.group())
        i = m.end()
        nargs = 1 if m.group() == "\\sqrt" else 2
        if nargs == 1:
            j = i
            while j < n and s[j] == " ":
                j += 1
            if j < n and s[j] == "[":  # \sqrt[3]{x}: the index stays as written
                close = s.find("]", j)
                if close < 0:
                    continue
                out.append(s[i : close + 1])
                i = close + 1
        for _ in range(nargs):
            j = i
            while j < n and s[j] == " ":
                j += 1
            if j >= n:
                break
            c = s[j]
            if c == "{":
                close = _matching_close(s, j)
                if close < 0:
                    break
                out.append("{" + brace_operator_arguments(s[j + 1 : close], _depth + 1) + "}")
                i = close + 1
            elif c == "\\":
                w = _CONTROL_WORD.match(s, j)
                if w is None or _BRACED_OPERATOR.fullmatch(w.group()):
                    break  # an operator as an argument: leave it to the parser
                out.append("{" + w.group() + "}")
                i = w.end()
            elif c.isalnum():
                out.append("{" + c + "}")
                i = j + 1
            else:
                break
    return "".join(out)


# A unit or currency written after (or a currency before) a number that is the whole answer. Only
# units spelled as units: a letter that may be a variable (h, t, l, x) is not one, and a one-letter
# unit (m, g, s) needs a space before it ("7.5 m^2", not "7.5m^2", which may be a product).
_UNIT_LONG = (r"(?:(?:k|c|m|d|\\mu\s*|u|n)m|(?:k|m)g|ms|min|hrs?|hours?|days?|weeks?|years?|(?:m|c|d)[lL]"
              r"|km/h|m/s|mph|ft|feet|foot|inch(?:es)?|yd|yards?|mi|miles?|lbs?|oz"
              r"|(?:kilo|centi|milli)?(?:meters?|metres?|grams?)|seconds?|minutes?|liters?|litres?|degrees?"
              r"|\\euro|€|£|¥|\\\$|\$|USD|EUR|dollars?|euros?|cents?|yuan|rupees?|pounds?)(?![A-Za-z])")
_UNIT_SHORT = r"(?:m|g|s|L)(?![A-Za-z])"
_UNIT_POWER = r"(?:\^\s*\{?\s*[23]\s*\}?)?"
_UNIT_SEP = r"(?:\s|\\[,;: ]|~)"
_NUMBER = r"[+-]?(?:\d+(?:[.,]\d+)*|\.\d+)"
_NUMBER_UNIT = re.compile(
    r"^(" + _NUMBER + r")(?:" + _UNIT_SEP + r"*(?:" + _UNIT_LONG + r"|\\(?:text|mathrm|textrm|mbox)\s*\{\s*(?:"
    + _UNIT_LONG + r"|" + _UNIT_SHORT + r")\s*\})|" + _UNIT_SEP + r"+" + _UNIT_SHORT + r")" + _UNIT_POWER + r"$")
_CURRENCY_NUMBER = re.compile(r"^(?:\\\$|\$|€|£|¥|\\euro|\\textdollar\b"
                              r"|\\(?:text|mathrm|textrm)\s*\{\s*\\\$\s*\})" + _UNIT_SEP + r"*(" + _NUMBER + r")$")
# "2,74": a decimal comma (the digits after it are not a group of three, or the number starts with 0).
_DECIMAL_COMMA = re.compile(r"^([+-]?)(\d+),(\d+)$")


def strip_number_unit(s: str) -> str:
    """``7.5 m^2`` / ``12 €`` / ``\\$12`` / ``5\\text{ cm}`` -> the number alone; anything else as is."""
    t = s.strip()
    m = _NUMBER_UNIT.match(t) or _CURRENCY_NUMBER.match(t)
    return m.group(1) if m else s


def decimal_comma(s: str) -> Optional[str]:
    """``2,74`` -> ``2.74`` and ``0,125`` -> ``0.125``: the decimal reading of a lone ``a,b``, or None
    where the comma groups thousands (``1,000``) or there is none."""
    m = _DECIMAL_COMMA.match(s.strip())
    if m is None or (len(m.group(3)) == 3 and not m.group(2).startswith("0")):
        return None
    if len(m.group(2)) > 1 and m.group(2).startswith("0"):
        return None  # "01,5" is no number
    return f"{m.group(1)}{m.group(2)}.{m.group(3)}"


def answer_spelling(answer: str) -> str:
    """The spelling of a number the grader reads: digit groups joined (``1 000``, ``1\\,000``), a
    unit or currency around a lone number dropped (``7.5 m^2``, ``12 €``); used for the vote key
    and for math-verify alike, so the verdict is on the answer that is reported."""
    return strip_number_unit(join_digit_groups(answer))


# Unicode math symbols that math-verify's LaTeX parser does not read (a gold ``(-∞, -3) ∪ (3, +∞)``
# of TinyV's HardVerify-Math, cn_k12 golds with ``kπ``): each is the LaTeX command it stands for.
# (not the middle dot: "3·5" is also a decimal point)
_UNICODE_MATH = {"∞": "\\infty ", "∪": "\\cup ", "∩": "\\cap ", "π": "\\pi ", "≤": "\\le ", "≥": "\\ge ",
                 "≠": "\\ne ", "−": "-", "×": "\\times "}
_UNICODE_MATH_RE = re.compile("|".join(_UNICODE_MATH))


def unicode_math(s: str) -> str:
    """``(-∞, -3) ∪ (3, +∞)`` -> ``(-\\infty , -3) \\cup  (3, +\\infty )``; text without them as is."""
    return _UNICODE_MATH_RE.sub(lambda m: _UNICODE_MATH[m.group()], s) if _UNICODE_MATH_RE.search(s) else s


def latex_for_math_verify(answer: str) -> str:
    """An answer or gold as math-verify should see it: number spellings read (:func:`answer_spelling`),
    Unicode math symbols as LaTeX (:func:`unicode_math`), operator arguments braced.

    Only rewrites spellings that math-verify otherwise misreads; anything else is returned as is.
    """
    return brace_operator_arguments(answer_spelling(unicode_math(answer)))


def answer_readings(answer: str, gold: bool = False) -> List[str]:
    """Every reading of an answer (``gold``: of a gold) for math-verify: one, or for an ambiguous
    ``2,74`` two -- the decimal comma (2.74) first, then the pair {2, 74} -- or the other forms of
    the same answer (:func:`~rlhf_ext.rewards.answer_forms.other_forms`: a percentage and its
    number, a text-wrapped option list, an equation naming the quantity, separate sets). Some
    reading of the answer equal to some reading of the gold is a right answer."""
    written = latex_for_math_verify(answer)
    decimal = decimal_comma(written)
    if decimal is not None:
        return [decimal, written]
    return other_forms(written, gold) or [written]

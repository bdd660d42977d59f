"""An answer as written -> its vote key: the normalized form a :class:`~rlhf_ext.rewards.GradeResult`
reports as ``extracted`` and majority voting counts. Pure string work, nothing evaluated.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

from .answer_finding import MAX_ANSWER_CHARS, strip_math_delimiters
from .answer_forms import number_word
from .answer_spelling import answer_spelling, brace_operator_arguments, decimal_comma

_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])|\\[!,;: ]|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=[^=]+$)")
THOUSANDS = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+)(\.\d+)?$")
_DECIMAL = re.compile(r"^([+-]?)(\d{0,60})(?:\.(\d{1,60}))?$")
_LATEX_FRACTION = re.compile(r"^([+-]?)\\frac\{([+-]?\d{1,60})\}\{([+-]?\d{1,60})\}$")
_DIGIT_SPACE = re.compile(r"(?<=\d)\s+(?=\d)")
_SLASH_FRACTION = re.compile(r"^([+-]?)(\d{1,60})/(\d{1,60})$")


def _canonical_number(s: str) -> Optional[str]:
    """Exact rational numbers in one spelling: "025" -> "25", "27.0" -> "27", "0.5" and "\\frac{1}{2}" -> "1/2"."""
    m = THOUSANDS.match(s)
    if m:
        s = m.group(1) + m.group(2).replace(",", "") + (m.group(3) or "")
    value = None
    m = _DECIMAL.match(s)
    if m and (m.group(2) or m.group(3)):
        value = Fraction(int(m.group(2) or "0") * 10 ** len(m.group(3) or "") + int(m.group(3) or "0"),
                         10 ** len(m.group(3) or ""))
        if m.group(1) == "-":
            value = -value
    else:
        for pattern in (_LATEX_FRACTION, _SLASH_FRACTION):
            m = pattern.match(s)
            if m:
                num, den = int(m.group(2)), int(m.group(3))
                if den == 0:
                    return None
                value = Fraction(num, den) * (-1 if m.group(1) == "-" else 1)
                break
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def normalize_answer(raw: str) -> str:
    """A vote key for an answer as written: spacing, delimiters, units of style and number spellings removed.

    Two answers with the same key are the same answer; the converse is math-verify's job (``x=3``
    and ``3`` share a key, ``\\sqrt{4}`` and ``2`` do not).
    """
    s = strip_math_delimiters(raw[:MAX_ANSWER_CHARS])
    s = answer_spelling(s)
    s = decimal_comma(s) or s
    s = _TEXT_MACRO.sub(r"\1", s)
    s = _SPACING.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = _DEGREES.sub("", s)
    s = brace_operator_arguments(s)
    s = s.strip().rstrip(".").strip()
    s = _ASSIGNMENT.sub("", s)
    # digits that spacing separates are not one number (math-verify reads "2 3" as a product): the key
    # keeps them apart, so that it never shows a number the grader did not grade
    s = "".join(_DIGIT_SPACE.sub("\0", s).split()).replace("\0", " ")
    number = _canonical_number(s) or number_word(s)  # "fourteen" votes with "14"
    return number if number is not None else s

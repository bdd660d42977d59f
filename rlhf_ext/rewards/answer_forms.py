"""Other forms of the same answer: the readings math-verify needs to see that two forms agree.

Right answers that rule graders miss come in classes (arXiv 2505.22203 measures the recall of
verl's, Qwen-Math's and math-verify's graders near 86% on real RL data; issue 41 lists the classes
found in rlhf_ext's misses). Each class here is a rewriting of the answer *as written* into a form
math-verify compares correctly, with the near miss of the same form still wrong:

* a percentage is also its number: ``17.5\\%`` reads as 0.175 (math-verify) and as 17.5 (how
  Qwen2.5-Math's ``math_equal`` accepts a percentage gold: ``evaluation/grader.py``, which tries
  the reference, /100 and x100). ``35/2`` then equals the gold ``17.5\\%``; ``1.75`` does not;
  ``50.0\\%`` equals the gold 50 as ``50\\%`` does; ``5.0\\%`` does not;
* a number written inside text is the number (``\\text{15 dollars}`` -> 15); an AMC-style option
  with its value (``\\textbf{(B) } 12``) reads as the letter and as the value;
* an option list wrapped in text is the list: ``\\text{A,D}`` / ``\\text{(A) and (D)}`` -> ``A, D``
  (math-verify reads the text as one symbol); ``\\text{A,C}`` stays a different list;
* an answer equation whose left side names the quantity (``E(2020, 1993) = 76``, ``f(3) = 76``,
  ``P(A) = \\frac38``) is also its right side (math-verify unwraps a left side of plain symbols, ``x
  = 76``, and misreads a function's arguments). A left side that is itself a number names nothing:
  every side must then be the answer, so the equation is read as the set of its sides (``5 = 76``
  is ``\\{5, 76\\}``, wrong against 76, where math-verify takes the right side). A left side that
  is a formula (``2+3 = 5``, ``x + y = 5``) is left to math-verify (its right side). A gold's
  equation is an equation (``a + 3z = 0`` is not the answer 0);
* a number written as a word is the number: "The answer is fourteen." -> 14;
* integers with an ellipsis are the integers it stands for (``10, 11, \\ldots, 14``);
* several answers given as separate sets, on the answer side only, also read as one flat list:
  ``\\{10, 11\\}, \\{-2, 2\\}`` -> ``10, 11, -2, 2``. A gold written as separate sets keeps them
  (a partition ``\\{1,3\\},\\{2,4\\}`` is not ``\\{1,2\\},\\{3,4\\}``).

Found on TinyV's HardVerify-Math (arXiv 2505.14625; session 15):

* values given to names, answer side only: ``w=16, d=3, a=1, b=1`` / ``T(10)=2, T(11)=4`` /
  ``Minimum: 1, Maximum: 3`` also read as the list of the values (math-verify compares the set of
  equations: two equal values, or a name with arguments, miss); ``w=16, ..., b=2`` stays wrong;
* numbers each with a text label, ``7 \\text{ goats and } 4 \\text{ helicopters}``, read as the list
  ``7, 4`` only, on either side (math-verify reads the first number alone, so ``40 \\text{ a}, 50
  \\text{ b}`` equalled ``40 \\text{ a}, 60 \\text{ b}``: a false positive removed);
* an ordinal is its number: ``12^{\\mathrm{th}}``, ``12th`` -> 12;
* a column vector is the tuple of its entries: ``\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}``
  equals ``(-7,16,5)`` (math-verify: a matrix is no tuple); ``(-7,16,6)`` stays wrong;
* a function defined on another variable name is the same function: ``f(n) = 2n + 1007`` equals
  ``f(m) = 2m + 1007`` (both also read with the variable ``\\xi``); ``f(m) = 2m + 1008`` stays wrong;
* set-builder notation is its relation, ``\\{x \\mid -1 < x < 1\\}`` -> ``-1 < x < 1``, which
  math-verify compares with the interval ``(-1, 1)``; ``(-1, 1]`` stays wrong.

An answer written as a rounded decimal (``(0.6, 2.6667]`` against ``(\\frac35, \\frac83]``) is
compared at the places it writes, when it writes at least 4 significant digits (:func:`rounding_digits`).

An interval and the inequality that denotes it (``[\\frac12, 8]`` against ``\\frac12 \\le x \\le
8``, both directions, bounds strict or not as written) are compared by math-verify itself
(``verify(..., allow_set_relation_comp=True)``, :mod:`.math_verify_recipe`).

Pure string work on the answer as written, bounded by its length; nothing is evaluated.
"""

from __future__ import annotations

import re
from typing import List, Optional

# "17.5\%", "50%", "-3.5 \%": a number and its percent sign, nothing else
_PERCENT = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*\\?%$")
# a text macro around the whole answer
_TEXT_WRAP = re.compile(r"^\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{(.*)\}$", re.S)
# an option letter, with or without its parentheses, and what may separate two of them
_OPTION = r"\(?\s*[A-Z]\s*\)?"
_OPTION_LIST = re.compile(r"^" + _OPTION + r"(?:\s*(?:,|;|&|\band\b|\s)\s*" + _OPTION + r")+$")
_OPTION_LETTER = re.compile(r"[A-Z]")
# relations other than "=": an answer with one is not an equation read here
_OTHER_RELATION = re.compile(r"<|>|\\(?:le|ge|leq|geq|leqslant|geqslant|neq|ne|approx|sim|equiv|to|in|subset)"
                             r"(?![A-Za-z])|!=|:=")
_CONTROL_WORD = re.compile(r"\\[A-Za-z]+")
# a left side math-verify already unwraps (only symbols): "x", "a_1", "\alpha", "x_{10}"
_PLAIN_SYMBOL = re.compile(r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w{1,8}\}?)?$")
_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+|\\[dt]?frac\{\d+\}\{\d+\})$")
_MAX_FORM_CHARS = 400
_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
          "sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_NUMBER_WORDS = {w: i for i, w in enumerate(_UNITS)}
_NUMBER_WORDS.update({t: 20 + 10 * i for i, t in enumerate(_TENS)})
_NUMBER_WORDS.update({f"{t}{sep}{u}": 20 + 10 * i + j for i, t in enumerate(_TENS) for j, u in enumerate(_UNITS)
                      if 1 <= j <= 9 for sep in ("-", " ")})
_NUMBER_WORDS["one hundred"] = _NUMBER_WORDS["a hundred"] = 100


def _top_level_split(s: str, sep: str) -> Optional[List[str]]:
    """``s`` split at every ``sep`` outside braces, brackets and parentheses; None when they do not balance."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            i += 2  # an escaped brace or a control word's first letter
            continue
        if c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    if depth != 0:
        return None
    parts.append(s[start:])
    return parts


def _has_letter(s: str) -> bool:
    """Whether ``s`` names something: an ASCII letter outside LaTeX control words (``\\frac``, ``\\pi``)."""
    return any(c.isalpha() and c.isascii() for c in _CONTROL_WORD.sub(" ", s))


def percent_number(s: str) -> Optional[str]:
    """``17.5\\%`` -> ``17.5``: the number of a percentage, or None."""
    m = _PERCENT.match(s.strip())
    return m.group(1) if m else None


def _fractional_percent(s: str) -> Optional[str]:
    # math-verify already equates an integer percentage with its number (50\% = 50 = 0.5): only one
    # written with a decimal point needs its number as a second reading -- 17.5\%, and 50.0\%, which
    # math-verify reads as the Float 0.5 and so scores wrong against a gold 50 (ToRA's GSM8K answers
    # "\boxed{50.0\%}" to "what percentage...", tests/data/SOURCES.md)
    number = percent_number(s)
    return number if number is not None and "." in number else None


def option_list(s: str) -> Optional[str]:
    """``\\text{A,D}`` / ``\\text{(A), (D)}`` / ``(A) and (D)`` -> ``A, D``; None unless ``s`` is a
    list of two or more option letters."""
    t = s.strip()
    m = _TEXT_WRAP.match(t)
    if m:
        t = m.group(1).strip()
    if len(t) > 200 or not _OPTION_LIST.match(t):
        return None
    return ", ".join(_OPTION_LETTER.findall(t))


def _names_a_quantity(left: str) -> bool:
    """``E(2020, 1993)``, ``f(3)``, ``P(A)``, ``m\\angle ABC``, ``|AB|``: a name (letters, with any
    arguments in brackets), not a formula (no operator outside brackets) and not a plain symbol
    (math-verify unwraps ``x = 5`` itself)."""
    if not _has_letter(left) or _PLAIN_SYMBOL.match(left):
        return False
    depth = 0
    for i, c in enumerate(left):
        if c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
        elif depth == 0 and (c in "+-*/^<>=!" or left.startswith(("\\cdot", "\\times", "\\div", "\\pm"), i)):
            return False
    return depth == 0


def equation_reading(s: str) -> Optional[str]:
    """The reading of an answer ``L = R`` (see the module docstring): ``R`` when ``L`` names the
    quantity, the set of every side when ``L`` is a plain number; None when ``s`` is no such
    equation (math-verify then reads it as it does: a right side of plain symbols' equation, an
    equation between unknowns)."""
    if "=" not in s or _OTHER_RELATION.search(s):
        return None
    sides = _top_level_split(s, "=")
    if sides is None or len(sides) < 2:
        return None
    sides = [side.strip() for side in sides]
    if any(not side for side in sides):
        return None
    if _PLAIN_NUMBER.match(sides[0]):
        if any(_top_level_split(side, ",") != [side] for side in sides):
            return None  # a tuple on a side: not a statement about one number
        return "\\{" + ", ".join(sides) + "\\}"
    return sides[-1] if _names_a_quantity(sides[0]) else None


def set_list(s: str) -> Optional[str]:
    """``\\{10, 11\\}, \\{-2, 2\\}`` -> ``10, 11, -2, 2``: separate sets as one flat list; None unless
    ``s`` is two or more ``\\{...\\}`` sets and nothing else."""
    parts = re.split(r"\s*(?:,|;|\\cup|\band\b|\\text\{\s*and\s*\})\s*(?=\\\{)", s.strip())
    if len(parts) < 2:
        return None
    items = []
    for part in parts:
        part = part.strip().rstrip(",; ")
        if not (part.startswith("\\{") and part.endswith("\\}")):
            return None
        inner = part[2:-2]
        if "\\{" in inner or "\\}" in inner or not inner.strip():
            return None
        items.append(inner.strip())
    return ", ".join(items)


NUMBER_WORD = re.compile(r"(?i)\b(?:" + "|".join(sorted((re.escape(w) for w in _NUMBER_WORDS), key=len, reverse=True))
                         + r")\b")


def number_word(s: str) -> Optional[str]:
    """``fourteen`` / ``Twenty-one`` -> ``14`` / ``21``: an answer written as one English number (0 to 100)."""
    value = _NUMBER_WORDS.get(re.sub(r"\s+", " ", s.strip().strip(".").lower()))
    return None if value is None else str(value)


_ARITHMETIC = re.compile(r"\d\s*(?:[+*/^]|\\(?:cdot|times|div))")
_DECIMAL_IN_TEXT = re.compile(r"(?<![\d.])(\d*)\.(\d+)(?![\d.])")


def rounding_digits(answer: str) -> Optional[int]:
    """The decimals an answer rounds to, when it writes a rounded value on purpose: the places of its
    most precise decimal (2 to 5; math-verify rounds to 6 anyway), if that decimal has at least 4
    significant digits and the answer is values, not arithmetic on them. ``(0.6, 2.6667]`` -> 4, so
    it equals ``(\\frac35, \\frac83]`` compared at 4 places, as Qwen2.5-Math's ``math_equal`` accepts
    it (relative tolerance 1e-4); ``0.33`` for 1/3 (2 digits) is not an answer to 4 digits. None when
    no such decimal is written."""
    if len(answer) > _MAX_FORM_CHARS or _ARITHMETIC.search(answer):
        return None  # "326.5+1" is a sum, not a value written rounded
    best = None
    for m in _DECIMAL_IN_TEXT.finditer(answer):
        places = len(m.group(2))
        significant = len((m.group(1) + m.group(2)).lstrip("0"))
        if best is None or places > best[0]:
            best = (places, significant)
    if best is None or not 2 <= best[0] <= 5 or best[1] < 4:
        return None
    return best[0]


_OR = re.compile(r"\s*(?:\\(?:text|textrm|mathrm)\s*\{\s*or\s*\}|\\lor(?![A-Za-z])|\\vee(?![A-Za-z])|\bor\b)\s*")
_LESS = r"(<|\\le(?:q|qslant)?(?![A-Za-z]))"
_MORE = r"(>|\\ge(?:q|qslant)?(?![A-Za-z]))"
_VAR = r"([A-Za-z])"
_BOUND = r"([^<>=]+?)"
_RELATIONS = [  # (pattern, variable group, how its groups make an interval)
    (re.compile(r"^" + _VAR + r"\s*" + _LESS + r"\s*" + _BOUND + r"$"), lambda m: ("-", None, m[3], m[2])),
    (re.compile(r"^" + _VAR + r"\s*" + _MORE + r"\s*" + _BOUND + r"$"), lambda m: ("+", m[2], m[3], None)),
    (re.compile(r"^" + _BOUND + r"\s*" + _LESS + r"\s*" + _VAR + r"$"), lambda m: ("+", m[2], m[1], None)),
    (re.compile(r"^" + _BOUND + r"\s*" + _MORE + r"\s*" + _VAR + r"$"), lambda m: ("-", None, m[1], m[2])),
    (re.compile(r"^" + _BOUND + r"\s*" + _LESS + r"\s*" + _VAR + r"\s*" + _LESS + r"\s*" + _BOUND + r"$"),
     lambda m: ("2", m[2], m[1], m[4], m[5])),
    # "a = 1" beside intervals ("a \le -2 or a = 1", HardVerify-Math): the point, as a set of one
    (re.compile(r"^" + _VAR + r"\s*=\s*" + _BOUND + r"$"), lambda m: ("=", None, m[2], None)),
]


def _interval(part: str):
    """(variable, interval as LaTeX) of one relation of one variable and numbers, or None."""
    for pattern, make in _RELATIONS:
        m = pattern.match(part.strip())
        if m is None:
            continue
        var = next(g for g in m.groups() if g is not None and len(g) == 1 and g.isalpha())
        spec = make(m)
        bounds = spec[2:3] if spec[0] != "2" else (spec[2], spec[4])
        if any(_has_letter(b) for b in bounds):
            return None  # a bound in letters: not an interval of numbers
        if spec[0] == "=":
            return var, "\\{" + spec[2].strip() + "\\}"
        if spec[0] == "-":
            return var, "(-\\infty, " + spec[2].strip() + (")" if spec[3] == "<" or spec[3] == ">" else "]")
        if spec[0] == "+":
            return var, ("(" if spec[1] in "<>" else "[") + spec[2].strip() + ", \\infty)"
        return var, (("(" if spec[1] == "<" else "[") + spec[2].strip() + ", " + spec[4].strip()
                     + (")" if spec[3] == "<" else "]"))
    return None


def relation_union(s: str) -> Optional[str]:
    """``k < -5 \\text{ or } k > 5`` -> ``(-\\infty, -5) \\cup (5, \\infty)``: relations of one variable
    joined by "or" as the union of the intervals they denote (math-verify reads them as a set of
    relations, equal to nothing); None for anything else."""
    parts = _OR.split(s.strip())
    if len(parts) < 2 or len(parts) > 8:
        return None
    found = [_interval(part) for part in parts]
    if any(f is None for f in found) or len({f[0] for f in found}) != 1:
        return None
    if all(f[1].startswith("\\{") for f in found):
        return None  # "x = 1 or x = 2" is a list of values: math-verify reads it
    return " \\cup ".join(f[1] for f in found)


# "\text{15 dollars}": a number and words, all in text; "\textbf{(B) } 12": an option and its value
_TEXT_NUMBER = re.compile(r"^\\(?:text|textrm|mathrm|mbox)\s*\{\s*([+-]?\d+(?:\.\d+)?)"
                          r"(?:\s+[A-Za-z][A-Za-z. ]*)?\s*\}$")
_OPTION_VALUE = re.compile(r"^(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?\(([A-E])\)"
                           r"(?:\s+\}(?:\s|\\[,;: ])*|\}?(?:\s|\\[,;: ])+)"
                           r"([+-]?(?:\d|\\[dt]?frac|\\sqrt|\\pi)[^(){}=<>]*(?:\{[^{}]*\}[^(){}=<>]*)*)$")


def text_number(s: str) -> Optional[str]:
    """``\\text{15 dollars}`` -> ``15``; None unless the whole answer is a number and words in text."""
    m = _TEXT_NUMBER.match(s.strip())
    return m.group(1) if m else None


def option_value(s: str) -> Optional[List[str]]:
    """``\\textbf{(B) } 12`` / ``(B) 12`` -> ``["B", "12"]``: an AMC-style option letter and the value it
    shows, each a reading (the gold may be either); None otherwise."""
    m = _OPTION_VALUE.match(s.strip())
    return [m.group(1), m.group(2)] if m else None


_RANGE = re.compile(r"(?<![\w.])([+-]?\d{1,9})\s*,\s*([+-]?\d{1,9})\s*,\s*(?:\\[lc]?dots(?![A-Za-z])|\.\.\.|…)\s*,"
                    r"\s*([+-]?\d{1,9})(?![\w.])")
_MAX_RANGE = 200


def expand_ranges(s: str) -> Optional[str]:
    """``10, 11, \\ldots, 14`` -> ``10, 11, 12, 13, 14``: integers with an ellipsis, the step set by the
    first two, written out (at most 200 terms, the last one on the step); None when there is none."""
    def expand(m):
        a, b, c = int(m.group(1)), int(m.group(2)), int(m.group(3))
        step = b - a
        if step == 0 or (c - a) % step or not 2 < (c - a) // step + 1 <= _MAX_RANGE:
            raise ValueError
        return ", ".join(str(v) for v in range(a, c + (1 if step > 0 else -1), step))

    if "dots" not in s and "..." not in s and "…" not in s:
        return None
    try:
        out = _RANGE.sub(expand, s)
    except ValueError:
        return None  # a step the last term does not fall on: not a range of integers
    return out if out != s else None


# Found on TinyV's HardVerify-Math (session 15): right answers written as labelled values.
_LABEL_TEXT = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{[^{}$\\]{1,60}\}")
_SPACING = re.compile(r"\\[ ,;:!]|~|\\q?quad(?![A-Za-z])")
_LONE_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d+)?|\.\d+)")


def labelled_numbers(s: str) -> Optional[str]:
    """``40 \\text{ chocolate candies}, \\ 60 \\text{ hard candies}`` -> ``40, 60``; ``7 \\text{ goats
    and } 4 \\text{ helicopters}`` -> ``7, 4``: two or more numbers, each followed by its label in
    text. The list is then the only reading: math-verify reads the first number alone, so ``40
    \\text{ a}, 50 \\text{ b}`` would equal ``40 \\text{ a}, 60 \\text{ b}``. None otherwise."""
    labels = _LABEL_TEXT.findall(s)
    if len(labels) < 2 or len(labels) > 12:
        return None
    rest = _SPACING.sub(" ", _LABEL_TEXT.sub(" , ", s))
    numbers = [p.strip() for p in re.split(r",|\band\b", rest) if p.strip()]
    if len(numbers) != len(labels) or not all(_LONE_NUMBER.fullmatch(n) for n in numbers):
        return None
    # each number right before its label: "40 \text{a}", not "\text{a} 40"
    if not re.match(r"^\s*(?:\\[ ,;:!]|~|\s)*" + _LONE_NUMBER.pattern, s):
        return None
    return ", ".join(numbers)


# "w = 16", "T(10) = 2", "Minimum: 1": a name given a value
_NAMED_VALUE = re.compile(r"^(?:\\[ ,;:!]|~|\s)*(?:([A-Za-z](?:_\{?\w{1,8}\}?)?|[A-Za-z]\(\s*[\w+-]{1,8}\s*\))\s*="
                          r"|[A-Z][a-z]{1,15}(?: [a-z]{1,15})?\s*:)\s*([^=:<>]+?)\s*$")


def value_list(s: str) -> Optional[str]:
    """``w=16, d=3, a=1, b=1`` -> ``16, 3, 1, 1``; ``T(10)=2, T(11)=4`` -> ``2, 4``; ``Minimum: 1,
    Maximum: 3`` -> ``1, 3``: two or more names each given a value, as the list of the values.
    math-verify unwraps ``b=-3, c=0`` itself but compares the set of equations, so two equal values
    (``a = -2, b = -2`` against ``-2, -2``) or a name with arguments miss. None otherwise."""
    parts = _top_level_split(s, ",")
    if parts is None or not 2 <= len(parts) <= 12:
        return None
    values = []
    for part in parts:
        m = _NAMED_VALUE.match(part)
        if m is None or _has_letter(m.group(2)):
            return None  # a value in letters is a formula, not a value given
        values.append(m.group(2))
    return ", ".join(values)


_ORDINAL = re.compile(r"^([+-]?\d+)\s*(?:\^\s*\{?\s*(?:\\(?:mathrm|text|textrm)\s*\{\s*)?(?:st|nd|rd|th)\s*\}?\s*\}?"
                      r"|\\(?:text|textrm|mathrm)\s*\{\s*(?:st|nd|rd|th)\s*\}|(?:st|nd|rd|th))$")


def ordinal_number(s: str) -> Optional[str]:
    """``12^{\\mathrm{th}}`` / ``12^{th}`` / ``12th`` -> ``12``: an ordinal is its number; None otherwise."""
    m = _ORDINAL.match(s.strip())
    return m.group(1) if m else None


_SET_BUILDER = re.compile(r"^(?:\\(?:[Bb]igg?l?|left)\s*)?\\\{\s*([A-Za-z])\s*(?:\||\\mid(?![A-Za-z])|:)\s*(.+?)\s*"
                          r"(?:\\(?:[Bb]igg?r?|right)\s*)?\\\}$", re.S)


def set_builder(s: str) -> Optional[str]:
    """``\\{x \\mid -1 < x < 1\\}`` / ``\\{x | x < 2 \\text{ or } x > 3\\}`` -> the relation, which
    math-verify compares with the interval it denotes (``(-1, 1)``); None unless ``s`` is the set of a
    variable satisfying relations in it."""
    m = _SET_BUILDER.match(s.strip())
    if m is None or not re.search(r"<|>|\\[lg]e", m.group(2)):
        return None
    if re.search(r"(?<![A-Za-z\\])" + m.group(1) + r"(?![A-Za-z])", m.group(2)) is None:
        return None
    return m.group(2)


_COLUMN_VECTOR = re.compile(r"^\\begin\{[pb]matrix\}(.*)\\end\{[pb]matrix\}$", re.S)


def column_tuple(s: str) -> Optional[str]:
    """``\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}`` -> ``(-7, 16, 5)``: a column vector is the
    tuple of its entries (math-verify reads a matrix and a tuple as different things); None unless
    ``s`` is one column of 2 to 8 entries."""
    m = _COLUMN_VECTOR.match(s.strip())
    if m is None or "&" in m.group(1) or "\\begin" in m.group(1):
        return None
    entries = [e.strip() for e in m.group(1).split("\\\\")]
    if entries and not entries[-1]:
        entries.pop()  # a trailing row break
    if not 2 <= len(entries) <= 8 or not all(entries):
        return None
    return "(" + ", ".join(entries) + ")"


_FUNCTION_DEFINITION = re.compile(r"^([A-Za-z])\s*\(\s*([a-z])\s*\)\s*=\s*([^=<>]+)$")


def function_variable(s: str) -> Optional[str]:
    """``f(n) = 2n + 1007`` -> ``f(\\xi) = 2\\xi + 1007``: a function defined on one variable, the
    variable renamed ``\\xi`` (a bound name: ``f(z)=z`` and ``f(x)=x`` are the same function, which
    math-verify compares as different equations). Both sides get the reading, so they meet at
    ``\\xi``, a name no gold uses: ``f(n) = 2n`` does not become equal to a gold ``2x``. None for
    anything else."""
    m = _FUNCTION_DEFINITION.match(s.strip())
    if m is None or m.group(1) == m.group(2) or "\\xi" in m.group(3):
        return None
    renamed = re.sub(r"(?<![A-Za-z\\])" + m.group(2) + r"(?![A-Za-z])", lambda _: "\\xi ", m.group(3))
    return f"{m.group(1)}(\\xi) = {renamed.strip()}"


def other_forms(written: str, gold: bool) -> Optional[List[str]]:
    """The readings of an answer (or, with ``gold``, of a gold) beyond the one it is written in, in
    order; the written form itself is left out when it would mislead (``5 = 76``). None when there are
    none (the written form is then the only reading)."""
    s = written.strip()
    if not s or len(s) > _MAX_FORM_CHARS:
        return None
    expanded = expand_ranges(s)
    if expanded is not None:  # the ellipsis written out; math-verify cannot read it
        return other_forms(expanded, gold) or [expanded]
    number = _fractional_percent(s)
    if number is not None:
        return [s, number]
    number = ordinal_number(s)
    if number is not None:
        return [number]
    listed = labelled_numbers(s)
    if listed is not None:
        return [listed]
    vector = column_tuple(s)
    if vector is not None:
        return [s, vector]
    relation = set_builder(s)
    if relation is not None:
        return (other_forms(relation, gold) or [relation]) + [s]
    number = number_word(s)
    if number is not None:
        return [number]
    number = text_number(s)
    if number is not None:
        return [number, s]
    shown = option_value(s)
    if shown is not None:
        return shown + [s]
    union = relation_union(s)
    if union is not None:
        return [union, s]
    options = option_list(s)
    if options is not None:
        return [options, s]  # "A B" may also be the product math-verify reads
    renamed = function_variable(s)
    if gold:
        # a gold's equation is an equation (``a + 3z = 0`` is not 0), its sets a partition
        return [s, renamed] if renamed is not None else None
    values = value_list(s)
    if values is not None:
        return [values, s]
    equation = equation_reading(s)
    if equation is not None:
        return ([equation] if equation.startswith("\\{") else [s, equation]) + ([renamed] if renamed else [])
    if renamed is not None:
        return [s, renamed]
    flat = set_list(s)
    if flat is not None:
        return [s, flat]
    return None


__all__ = ["NUMBER_WORD", "column_tuple", "equation_reading", "expand_ranges", "function_variable",
           "labelled_numbers", "number_word",
           "option_list", "option_value", "ordinal_number", "other_forms", "percent_number", "relation_union",
           "rounding_digits", "set_builder", "set_list", "text_number", "value_list"]

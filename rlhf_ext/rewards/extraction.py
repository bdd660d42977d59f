"""Find the final answer in model text and in dataset golds; normalize it into a vote key.

Pure string work, linear in the length of the text, with nothing evaluated: safe to run on hostile
model output in any thread. The grader hands the *raw* candidate found here to math-verify; the
*normalized* form is the majority-vote key that :class:`~rlhf_ext.rewards.GradeResult` reports as
``extracted``.

Where the final answer is looked for, first hit wins:

1. the last ``<answer>...</answer>`` block (Open-R1's format), when it states an answer: the boxes
   of the final answer inside it, else a "the answer is" phrase inside it, else the whole block. A box
   written while thinking (``<think>try \\boxed{3}</think><answer>5</answer>``) does not
   override the answer the format asks for;
2. the boxes of the final answer (:func:`find_final_boxes`): the last complete, non-empty
   ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``), braces matched so that
   ``\\boxed{\\frac{1}{2}}`` yields ``\\frac{1}{2}``, with the boxes just before it that only
   separators divide from it (``\\boxed{2} and \\boxed{5}`` is the answer ``2, 5``, a set, as
   math-verify's ``boxed="all"`` reads it); an empty ``\\boxed{}`` after it does not hide it, and a
   bare ``\\boxed 5.`` loses the sentence's punctuation;
3. whichever comes last of a "the answer is X" / "final answer: X" / "Answer: X" phrase and
   GSM8K's ``#### X`` line; in a sentence of prose (``Final Answer: The largest $n$ is 34.``) X is
   the sentence's last math, not the sentence;
4. with ``require_anchor=False`` only (evaluation), when none of the above is found: the last math
   expression of the text (:func:`find_last_expression`), as lighteval and math-verify fall back.

:func:`latex_for_math_verify` rewrites an answer (or gold) before math-verify parses it, for the
spellings math-verify reads wrongly: digit groups separated by LaTeX spacing or a plain space
(``1\\,000``, ``1{,}000``, ``1~000``, ``1 000``) are joined (math-verify reads ``1\\,000`` as a
product), a unit or currency around a lone number is dropped (``7.5 m^2``, ``12 €``), and
unbraced operator arguments get their braces the way TeX reads them (``\\frac12`` ->
``\\frac{1}{2}``, ``2\\sqrt3`` -> ``2\\sqrt{3}``). A decimal comma (``2,74``) has two readings
(:func:`answer_readings`). The vote key is made from the same rewritten text, so the answer a
result reports is the one that was graded.

Golds (:func:`prepare_gold`) may be GSM8K solutions (``... #### 18``), full MATH solutions with a
``\\boxed{}``, bare answers (``\\frac{1}{2}``, ``"025"``), or numbers from JSON (``27.0``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Dict, List, Optional

# An answer longer than this is not a final answer; capping keeps every later step cheap.
MAX_ANSWER_CHARS = 2000

# Only escaped braces, escaped backslashes and bare braces matter for brace matching: "\\{" is a
# literal set brace, "\\\\" a LaTeX line break (so the brace after it is a real one).
_BRACE_TOKEN = re.compile(r"\\[{}\\]|[{}]")
_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed[ \t]+([^\s${}\\]+)")
# Sentence punctuation that follows a bare "\boxed 5" is not part of the answer.
_BARE_TRAILING = ".,;:!?"
_ANSWER_PHRASE = re.compile(r"(?i)\b(?:final\s+answer|answer)\s*(?:is\b\s*:?|:)[ \t]*")
_EMPTY_BOX = re.compile(r"\$*\s*\\(?:boxed|fbox)\s*\{\s*\}\s*\$*")
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)")
_NUMBER_THEN_WORDS = re.compile(r"^([+-]?(?:\d[\d,]*)?\.?\d+)(?:\s+[A-Za-z][A-Za-z.]*)+$")


@dataclass(frozen=True)
class AnswerCandidate:
    """A final answer found in text: ``raw`` as written (for math-verify), ``source`` the rule that found it."""

    raw: str
    source: str  # "boxed", "answer_tag", "phrase", "gsm8k"


def _matching_braces(text: str) -> Dict[int, int]:
    """Map the index of every ``{`` that has a matching ``}`` to the index of that ``}``; one pass."""
    stack: List[int] = []
    pairs: Dict[int, int] = {}
    for m in _BRACE_TOKEN.finditer(text):
        tok = m.group()
        if tok == "{":
            stack.append(m.start())
        elif tok == "}":
            if stack:
                pairs[stack.pop()] = m.start()
    return pairs


def _bare_boxed_content(token: str) -> str:
    """``\\boxed 5.`` -> ``5``: the sentence's punctuation, and a closing bracket that opens nowhere
    in the token (``(\\boxed 5)``), are not part of the answer."""
    while token:
        if token[-1] in _BARE_TRAILING:
            token = token[:-1]
        elif token[-1] in ")]" and token.count(token[-1]) > token.count("(" if token[-1] == ")" else "["):
            token = token[:-1]
        else:
            break
    return token


def find_last_boxed(text: str) -> Optional[str]:
    """Content of the last complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed X``, or None.

    An unclosed ``\\boxed{`` (a truncated answer) and an empty ``\\boxed{}`` are skipped in favour
    of an earlier complete one.
    """
    if "\\boxed" not in text and "\\fbox" not in text:
        return None
    pairs = None
    best_pos, best = -1, None
    for m in _BOXED_OPEN.finditer(text):
        if pairs is None:
            pairs = _matching_braces(text)
        close = pairs.get(m.end() - 1)
        if close is not None and m.start() > best_pos:
            content = text[m.end() : close]
            if len(content) <= MAX_ANSWER_CHARS and content.strip():
                best_pos, best = m.start(), content
    for m in _BOXED_BARE.finditer(text):
        if m.start() > best_pos:
            content = _bare_boxed_content(m.group(1))
            if content:
                best_pos, best = m.start(), content
    return best


# What may stand between two boxes of one final answer: spacing, math delimiters, commas, "and" /
# "or", and the variable each box names ("x = \\boxed{1} or x = \\boxed{-2}").
_BOX_GAP = re.compile(
    r"(?:\s|\$|[,;&]|\\\\|\\[()\[\]]|\\(?:q?quad|[,;:! ])|~|\b(?:and|or)\b"
    r"|\\(?:text|mathrm|textrm)\s*\{\s*(?:,|and|or)?\s*\}"
    r"|(?<![A-Za-z\\])[A-Za-z](?:_\{?\w{1,8}\}?)?\s*=)*"
)
_MAX_BOX_GAP = 80


def _complete_boxes(text: str) -> List[tuple]:
    """Every complete, non-empty box of ``text`` as (start, end, content), in order."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return []
    pairs = _matching_braces(text)
    boxes = []
    for m in _BOXED_OPEN.finditer(text):
        close = pairs.get(m.end() - 1)
        if close is not None:
            content = text[m.end() : close]
            if len(content) <= MAX_ANSWER_CHARS and content.strip():
                boxes.append((m.start(), close + 1, content))
    for m in _BOXED_BARE.finditer(text):
        content = _bare_boxed_content(m.group(1))
        if content:
            boxes.append((m.start(), m.start(1) + len(content), content))
    boxes.sort()
    # a box inside another (\boxed{\boxed{5}}) is the answer of both: keep the innermost
    out: List[tuple] = []
    for box in boxes:
        if out and box[0] < out[-1][1]:
            out[-1] = box
        else:
            out.append(box)
    return out


def find_final_boxes(text: str) -> List[str]:
    """Contents of every box of the final answer: the last complete, non-empty box and the boxes just
    before it with nothing but separators between them.

    ``The solutions are \\boxed{2} and \\boxed{5}.`` -> ``["2", "5"]``; ``x = \\boxed{1} or x =
    \\boxed{-2}`` -> ``["1", "-2"]``. A box earlier in the reasoning, with words between it and the
    final one, is not part of the final answer (math-verify's ``boxed="all"`` joins every box of
    the response: a response that boxes a first try and then its answer would state a set).
    """
    boxes = _complete_boxes(text)
    if not boxes:
        return []
    return [content for _, _, content in _final_group(text, boxes)]


# One final answer has at most this many parts (boxes, or math items in the fallback).
_MAX_PARTS = 32


def _final_group(text: str, items: List[tuple]) -> List[tuple]:
    """The last of ``items`` ((start, end, content), in order) and those just before it that only
    separators divide from it, at most ``_MAX_PARTS`` and ``MAX_ANSWER_CHARS`` in all."""
    group = [items[-1]]
    size = len(items[-1][2])
    for item in reversed(items[:-1]):
        gap = text[item[1] : group[-1][0]]
        size += len(item[2]) + 2
        if len(group) >= _MAX_PARTS or size > MAX_ANSWER_CHARS or len(gap) > _MAX_BOX_GAP \
                or not _BOX_GAP.fullmatch(gap):
            break
        group.append(item)
    group.reverse()
    return group


def _join_boxes(contents: List[str]) -> str:
    """Several boxes as one answer: the set of their contents (``2, 5``), as math-verify reads it; a
    content written twice (``\\boxed{7}\\boxed{7}``) is one element."""
    return ", ".join(dict.fromkeys(c.strip() for c in contents))


def _last_answer_tag(text: str) -> Optional[str]:
    # rfind, not a regex: ".*?" between many unclosed tags would be quadratic.
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end]


def _strip_math_delimiters(s: str) -> str:
    s = s.strip()
    for _ in range(3):  # "$$ $x$ $$" style nesting is not worth more
        if s.startswith("$$") and s.endswith("$$") and len(s) >= 4 and not s.endswith("\\$$"):
            s = s[2:-2].strip()
        elif s.startswith("$") and s.endswith("$") and len(s) >= 2 and not s.endswith("\\$"):
            s = s[1:-1].strip()
        elif (s.startswith("\\(") and s.endswith("\\)")) or (s.startswith("\\[") and s.endswith("\\]")):
            s = s[2:-2].strip()
        else:
            break
    return s


def _phrase_answer(after: str) -> Optional[str]:
    """The answer written right after "the answer is": a math span, or the rest of the sentence."""
    s = after.lstrip(" \t*:")
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(open_):
            end = s.find(close, len(open_))
            if end > len(open_):
                return s[len(open_) : end].strip() or None
            break
    line = s.split("\n", 1)[0][:MAX_ANSWER_CHARS]
    m = _SENTENCE_END.search(line)
    if m:
        line = line[: m.start()]
    line = line.strip().strip("*").strip()
    line = line.rstrip(".,;:!").strip()
    if not line or _EMPTY_BOX.fullmatch(line):  # "The answer is \\boxed{}." states nothing
        return None
    # "42 apples" -> "42": a number followed only by words is a number with a unit.
    m = _NUMBER_THEN_WORDS.match(line)
    if m:
        return m.group(1)
    # "Final Answer: The largest $n$ is 34." states its answer inside a sentence: the answer is the
    # sentence's last math (a span or a number), not the sentence -- when only a few words follow it
    # ("... is 34", "... is $\\frac34$ square units"), not more math ("$0 + 0 = I am not sure").
    if _PROSE_WORD.search(_strip_spans(line)):
        last = _last_math_group(line)
        if last is not None and _FEW_WORDS.fullmatch(line[last[1]:]):
            return last[0]
    return line


_FEW_WORDS = re.compile(r"[\s.,;:!?*]*(?:[A-Za-z]+[\s.,;:!?*]*){0,3}")
# A word of prose: two letters or more, not a LaTeX command or its braced argument.
_PROSE_WORD = re.compile(r"(?<![A-Za-z\\{])[A-Za-z]{2,}(?![A-Za-z}])")


def _strip_spans(line: str) -> str:
    """``line`` without its math spans (their words are math, not prose)."""
    spans = _math_spans(line)
    if not spans:
        return line
    parts, pos = [], 0
    for start, end, _ in spans:
        parts.append(line[pos:start])
        pos = end
    parts.append(line[pos:])
    return " ".join(parts)


def _last_phrase(text: str):
    last = None
    for m in _ANSWER_PHRASE.finditer(text):
        last = m
    if last is None:
        return None
    value = _phrase_answer(text[last.end() : last.end() + 4 * MAX_ANSWER_CHARS])
    if value and _EMPTY_BOX.fullmatch(value):  # "The answer is $\\boxed{}$" states nothing
        value = None
    return (last.start(), value) if value else None


def _last_gsm8k(text: str):
    pos = text.rfind("####")
    if pos < 0:
        return None
    value = text[pos + 4 :].split("\n", 1)[0].strip().strip("$").strip()
    value = value.rstrip(".").strip()
    return (pos, value) if value and len(value) <= MAX_ANSWER_CHARS else None


def _phrase_or_gsm8k(text: str) -> Optional[AnswerCandidate]:
    phrase = _last_phrase(text)
    gsm = _last_gsm8k(text)
    if phrase and (not gsm or phrase[0] > gsm[0]):
        return AnswerCandidate(phrase[1], "phrase")
    if gsm:
        return AnswerCandidate(gsm[1], "gsm8k")
    return None


def _answer_in_tag(tag: str) -> Optional[AnswerCandidate]:
    """The answer an ``<answer>`` block states: its last non-empty box, a phrase, or the whole block."""
    boxes = find_final_boxes(tag)
    if boxes:
        return AnswerCandidate(_join_boxes(boxes), "boxed")
    inner = _phrase_or_gsm8k(tag)
    if inner is not None:
        return AnswerCandidate(inner.raw, "answer_tag")
    tag = _strip_math_delimiters(tag)
    if tag and len(tag) <= MAX_ANSWER_CHARS and not _EMPTY_BOX.fullmatch(tag):
        return AnswerCandidate(tag, "answer_tag")
    return None


# The last texts searched, and what was found: the grader and the answer-format reward search the same
# response one after the other. Bounded in entries and in characters held; cleared when full.
_RECENT_MAX_ENTRIES = 4096
_RECENT_MAX_CHARS = 16_000_000
_recent: Dict[tuple, Optional[AnswerCandidate]] = {}
_recent_chars = [0]
_MISS = object()


def find_answer_candidate(text: str, require_anchor: bool = True) -> Optional[AnswerCandidate]:
    """The final answer stated in ``text`` as written there, with the rule that found it; None if none.

    Precedence: the last ``<answer>`` block that states an answer, then the boxes of the final
    answer, then the last "the answer is" phrase or ``####`` line (see the module docstring). With
    ``require_anchor=False`` (evaluation), a text with none of these anchors falls back to its last
    math expression or number (:func:`find_last_expression`), as math-verify does.
    """
    if not isinstance(text, str) or not text:
        return None
    key = (text, bool(require_anchor))
    found = _recent.get(key, _MISS)
    if found is not _MISS:
        return found
    found = _search_answer(text, require_anchor)
    if len(_recent) >= _RECENT_MAX_ENTRIES or _recent_chars[0] + len(text) > _RECENT_MAX_CHARS:
        _recent.clear()  # another thread may add meanwhile: the bound is approximate, never exceeded by much
        _recent_chars[0] = 0
    _recent[key] = found
    _recent_chars[0] += len(text)
    return found


def _search_answer(text: str, require_anchor: bool) -> Optional[AnswerCandidate]:
    tag = _last_answer_tag(text)
    if tag is not None:
        answer = _answer_in_tag(tag)
        if answer is not None and answer.raw:
            return answer
    boxes = find_final_boxes(text)
    if boxes:
        return AnswerCandidate(_join_boxes(boxes), "boxed")
    found = _phrase_or_gsm8k(text)
    if found is None and not require_anchor:
        last = find_last_expression(text)
        if last is not None:
            found = AnswerCandidate(last, "fallback")
    return found


# --- the fallback without an anchor ------------------------------------------------------------

# Math delimiters, and the escaped dollar that is not one.
_MATH_DELIM = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSES = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
# A number written as prose, not a digit inside LaTeX (``\\frac{1}{2}``, ``x^2``, ``a_1``).
_LAST_NUMBER = re.compile(r"(?<![\w.\\{^_/])[+-]?\d+(?:[.,]\d+)*(?:\s*/\s*\d+(?:\.\d+)?)?(?![\w}^/])")
_FALLBACK_TAIL = 4 * MAX_ANSWER_CHARS


def _math_spans(text: str) -> List[tuple]:
    """(start, end, content) of every closed math span (``$..$``, ``$$..$$``, ``\\(..\\)``,
    ``\\[..\\]``); one pass over the delimiters."""
    spans = []
    open_tok, open_end, open_start = None, 0, 0
    for m in _MATH_DELIM.finditer(text):
        tok = m.group()
        if tok == "\\$" or tok == "\\\\":  # an escaped dollar, a line break
            continue
        if open_tok is None:
            if tok in _CLOSES:
                open_tok, open_start, open_end = tok, m.start(), m.end()
        elif tok == _CLOSES[open_tok]:
            content = text[open_end : m.start()].strip()
            if content:
                spans.append((open_start, m.end(), content))
            open_tok = None
    return spans


def _math_items(text: str) -> List[tuple]:
    """(start, end, math) of every math span of ``text`` and every number (or fraction ``4/3``)
    written outside them, in order. A span's closing punctuation (``$\\tan 46^\\circ.$``) is not math."""
    spans = [(a, b, c.rstrip(".,;:").rstrip()) for a, b, c in _math_spans(text)]
    spans = [sp for sp in spans if sp[2] and len(sp[2]) <= MAX_ANSWER_CHARS and not _EMPTY_BOX.fullmatch(sp[2])]
    items, pos = [], 0
    for span in spans + [(len(text), len(text), None)]:
        items.extend((m.start(), m.end(), m.group()) for m in _LAST_NUMBER.finditer(text, pos, span[0]))
        if span[2] is not None:
            items.append(span)
        pos = max(pos, span[1])
    return items


def _last_math_group(text: str) -> Optional[tuple]:
    """(answer, end): the last math item of ``text`` with the items just before it that only separators
    divide from it (``$2$ and $5$`` -> ``2, 5``), and where it ends; None without math."""
    items = _math_items(text)
    if not items:
        return None
    group = _final_group(text, items)
    return _join_boxes([g[2] for g in group]), group[-1][1]


def find_last_expression(text: str) -> Optional[str]:
    """The last math expression of ``text``: its last math span or number written outside one, with
    the ones just before it that only separators divide from it (``$2$ and $5$`` -> ``2, 5``).

    The fallback that lighteval and math-verify use when a response has no anchor
    (``try_extract_without_anchor``): ``... the probability is $\\frac{2}{3}$.`` -> ``\\frac{2}{3}``,
    ``... so she has 12 apples.`` -> ``12``. Only the text's tail is read (an answer is at the end).
    """
    if not isinstance(text, str) or not text:
        return None
    found = _last_math_group(text[-_FALLBACK_TAIL:])
    return found[0] if found else None


# --- LaTeX that math-verify reads wrongly ---------------------------------------------------------

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
_CURRENCY_NUMBER = re.compile(r"^(?:\\\$|\$|€|£|¥|\\euro)" + _UNIT_SEP + r"*(" + _NUMBER + r")$")
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


def latex_for_math_verify(answer: str) -> str:
    """An answer or gold as math-verify should see it: number spellings read (:func:`answer_spelling`),
    operator arguments braced.

    Only rewrites spellings that math-verify otherwise misreads; anything else is returned as is.
    """
    return brace_operator_arguments(answer_spelling(answer))


def answer_readings(answer: str) -> List[str]:
    """Every reading of an answer for math-verify: one, or for an ambiguous ``2,74`` two -- the
    decimal comma (2.74) first, then the pair {2, 74}. The gold decides which was meant."""
    written = latex_for_math_verify(answer)
    decimal = decimal_comma(written)
    return [decimal, written] if decimal is not None else [written]


# --- normalization into a vote key -------------------------------------------------------------

_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])|\\[!,;: ]|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=[^=]+$)")
_THOUSANDS = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+)(\.\d+)?$")
_DECIMAL = re.compile(r"^([+-]?)(\d{0,60})(?:\.(\d{1,60}))?$")
_LATEX_FRACTION = re.compile(r"^([+-]?)\\frac\{([+-]?\d{1,60})\}\{([+-]?\d{1,60})\}$")
_DIGIT_SPACE = re.compile(r"(?<=\d)\s+(?=\d)")
_SLASH_FRACTION = re.compile(r"^([+-]?)(\d{1,60})/(\d{1,60})$")


def _canonical_number(s: str) -> Optional[str]:
    """Exact rational numbers in one spelling: "025" -> "25", "27.0" -> "27", "0.5" and "\\frac{1}{2}" -> "1/2"."""
    m = _THOUSANDS.match(s)
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
    s = _strip_math_delimiters(raw[:MAX_ANSWER_CHARS])
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
    number = _canonical_number(s)
    return number if number is not None else s


def extract_answer(text: str, require_anchor: bool = True) -> Optional[str]:
    """The normalized final answer of ``text`` (a majority-vote key), or None when it states none.

    Same rules as the grader uses (``require_anchor`` as :class:`~rlhf_ext.rewards.MathGrader`'s);
    no math-verify, no evaluation, linear time.
    """
    candidate = find_answer_candidate(text, require_anchor=require_anchor)
    if candidate is None:
        return None
    key = normalize_answer(candidate.raw)
    return key or None


# --- golds -------------------------------------------------------------------------------------


def prepare_gold(gold) -> Optional[str]:
    """The answer part of a dataset gold, as a string for math-verify; None when there is none.

    ``"... #### 1,234"`` (GSM8K) -> ``"1234"``; a solution with ``\\boxed{}`` -> the last boxed
    content; ``27.0`` (AMC, a JSON number) -> ``"27.0"``; ``"$\\frac12$"`` -> ``"\\frac12"``.
    Booleans, None, NaN and blank strings have no answer.
    """
    if gold is None or isinstance(gold, bool):
        return None
    if isinstance(gold, int):
        return str(gold)
    if isinstance(gold, float):
        if not math.isfinite(gold):
            return None
        text = repr(gold)
        if "e" in text:  # positional notation: math-verify cannot read repr's "1e+20"
            text = format(Decimal(text), "f")
        return text
    if not isinstance(gold, str):
        return None
    return _prepare_gold_text(gold)


@functools.lru_cache(maxsize=2048)
def _prepare_gold_text(gold: str) -> Optional[str]:
    # a GRPO group's samples share their label: its answer is found once
    text = gold.strip()
    if not text:
        return None
    if "####" in text:
        value = text[text.rfind("####") + 4 :].strip().split("\n", 1)[0].strip()
        value = value.strip("$").strip()
        if _THOUSANDS.match(value):
            value = value.replace(",", "")
        return value or None
    boxes = find_final_boxes(text)
    if boxes:
        text = _join_boxes(boxes)
    text = _strip_math_delimiters(text)
    return text or None

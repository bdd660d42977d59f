"""Find the final answer in model text and in dataset golds; normalize it into a vote key.

Pure string work, linear in the length of the text, with nothing evaluated: safe to run on hostile
model output in any thread. The grader hands the *raw* candidate found here to math-verify; the
*normalized* form is the majority-vote key that :class:`~rlhf_ext.rewards.GradeResult` reports as
``extracted``.

Where the final answer is looked for, first hit wins:

1. the last complete ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``), braces matched so that
   ``\\boxed{\\frac{1}{2}}`` yields ``\\frac{1}{2}``;
2. the last ``<answer>...</answer>`` block (Open-R1's format); a "the answer is" phrase inside it
   is honoured, otherwise the whole block is the answer;
3. whichever comes last of a "the answer is X" / "final answer: X" / "Answer: X" phrase and
   GSM8K's ``#### X`` line.

Golds (:func:`prepare_gold`) may be GSM8K solutions (``... #### 18``), full MATH solutions with a
``\\boxed{}``, bare answers (``\\frac{1}{2}``, ``"025"``), or numbers from JSON (``27.0``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Dict, List, Optional

# An answer longer than this is not a final answer; capping keeps every later step cheap.
MAX_ANSWER_CHARS = 2000

# Only escaped braces, escaped backslashes and bare braces matter for brace matching: "\\{" is a
# literal set brace, "\\\\" a LaTeX line break (so the brace after it is a real one).
_BRACE_TOKEN = re.compile(r"\\[{}\\]|[{}]")
_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed[ \t]+([^\s${}\\]+)")
_ANSWER_PHRASE = re.compile(r"(?i)\b(?:final\s+answer|answer)\s*(?:is\b\s*:?|:)[ \t]*")
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


def find_last_boxed(text: str) -> Optional[str]:
    """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed X`` in ``text``, or None.

    An unclosed ``\\boxed{`` (a truncated answer) is skipped in favour of an earlier complete one.
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
            if len(content) <= MAX_ANSWER_CHARS:
                best_pos, best = m.start(), content
    for m in _BOXED_BARE.finditer(text):
        if m.start() > best_pos:
            best_pos, best = m.start(), m.group(1)
    return best


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
    if not line:
        return None
    # "42 apples" -> "42": a number followed only by words is a number with a unit.
    m = _NUMBER_THEN_WORDS.match(line)
    if m:
        line = m.group(1)
    return line


def _last_phrase(text: str):
    last = None
    for m in _ANSWER_PHRASE.finditer(text):
        last = m
    if last is None:
        return None
    value = _phrase_answer(text[last.end() : last.end() + 4 * MAX_ANSWER_CHARS])
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


def find_answer_candidate(text: str) -> Optional[AnswerCandidate]:
    """The final answer stated in ``text`` as written there, with the rule that found it; None if none."""
    if not isinstance(text, str) or not text:
        return None
    boxed = find_last_boxed(text)
    if boxed is not None and boxed.strip():
        return AnswerCandidate(boxed.strip(), "boxed")
    tag = _last_answer_tag(text)
    if tag is not None:
        inner = _phrase_or_gsm8k(tag)
        if inner is not None:
            return AnswerCandidate(inner.raw, "answer_tag")
        tag = _strip_math_delimiters(tag)
        if tag and len(tag) <= MAX_ANSWER_CHARS:
            return AnswerCandidate(tag, "answer_tag")
    return _phrase_or_gsm8k(text)


# --- normalization into a vote key -------------------------------------------------------------

_TEXT_MACRO = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])|\\[!,;: ]|~")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_FRAC_SHORT = (
    (re.compile(r"\\frac\s*(\d)\s*(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac\s*\{([^{}]*)\}\s*(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac\s*(\d)\s*\{"), r"\\frac{\1}{"),
)
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=[^=]+$)")
_THOUSANDS = re.compile(r"^([+-]?)(\d{1,3}(?:,\d{3})+)(\.\d+)?$")
_DECIMAL = re.compile(r"^([+-]?)(\d{0,60})(?:\.(\d{1,60}))?$")
_LATEX_FRACTION = re.compile(r"^([+-]?)\\frac\{([+-]?\d{1,60})\}\{([+-]?\d{1,60})\}$")
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
    s = _TEXT_MACRO.sub(r"\1", s)
    s = _SPACING.sub(" ", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = _DEGREES.sub("", s)
    for pattern, repl in _FRAC_SHORT:
        s = pattern.sub(repl, s)
    s = s.strip().rstrip(".").strip()
    s = _ASSIGNMENT.sub("", s)
    s = "".join(s.split())
    number = _canonical_number(s)
    return number if number is not None else s


def extract_answer(text: str) -> Optional[str]:
    """The normalized final answer of ``text`` (a majority-vote key), or None when it states none.

    Same rules as the grader uses; no math-verify, no evaluation, linear time.
    """
    candidate = find_answer_candidate(text)
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
        return repr(gold) if math.isfinite(gold) else None
    if not isinstance(gold, str):
        return None
    text = gold.strip()
    if not text:
        return None
    if "####" in text:
        value = text[text.rfind("####") + 4 :].strip().split("\n", 1)[0].strip()
        value = value.strip("$").strip()
        if _THOUSANDS.match(value):
            value = value.replace(",", "")
        return value or None
    boxed = find_last_boxed(text)
    if boxed is not None:
        text = boxed.strip()
    text = _strip_math_delimiters(text)
    return text or None

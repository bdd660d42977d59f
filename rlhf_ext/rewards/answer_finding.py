"""Where a response (or a gold) states its final answer: boxes, ``<answer>`` tags, answer phrases, GSM8K's ``####``.

Pure string work, linear in the length of the text, with nothing evaluated: safe to run on hostile
model output in any thread. What is found is the *raw* candidate the grader hands to math-verify
(:func:`find_answer_candidate`); :mod:`.answer_normalization` turns it into a vote key.

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
4. with ``require_anchor=False`` only (evaluation), when none of the above is found: the printed
   result of a tool-integrated response when the sentence after it restates it
   (:func:`_restated_program_output`), else the last math expression of the text
   (:func:`find_last_expression`), as lighteval and math-verify fall back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

from .answer_forms import NUMBER_WORD, number_word

# An answer longer than this is not a final answer; capping keeps every later step cheap.
MAX_ANSWER_CHARS = 2000

# Only escaped braces, escaped backslashes and bare braces matter for brace matching: "\\{" is a
# literal set brace, "\\\\" a LaTeX line break (so the brace after it is a real one).
_BRACE_TOKEN = re.compile(r"\\[{}\\]|[{}]")
_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_BARE = re.compile(r"\\boxed[ \t]+([^\s${}\\]+)")
# Sentence punctuation that follows a bare "\boxed 5" is not part of the answer.
_BARE_TRAILING = ".,;:!?"
ANSWER_PHRASE = re.compile(r"(?i)\b(?:final\s+answer|answer)\s*(?:is\b\s*:?|:)[ \t]*")
_EMPTY_BOX = re.compile(r"\$*\s*\\(?:boxed|fbox)\s*\{\s*\}\s*\$*")
_SENTENCE_END = re.compile(r"[.!?;](?=\s|$)")
# "42 apples", "14 (since T = 12)": a number, then words or a remark in parentheses
_NUMBER_THEN_WORDS = re.compile(r"^([+-]?(?:\d[\d,]*)?\.?\d+)(?:\s+[A-Za-z][A-Za-z.]*|\s*\([^()]{1,80}\))+$")


@dataclass(frozen=True)
class AnswerCandidate:
    """A final answer found in text: ``raw`` as written (for math-verify), ``source`` the rule that found it."""

    raw: str
    source: str  # "boxed", "answer_tag", "phrase", "gsm8k"


def _matching_braces(text: str, start: int = 0) -> Dict[int, int]:
    """Map the index of every ``{`` at or after ``start`` that has a matching ``}`` to the index of
    that ``}``; one pass. A brace opened at or after ``start`` is matched by what follows it alone,
    whatever came before, when ``start`` is not a backslash before a brace or backslash (a box's
    backslash, followed by a letter, never is)."""
    stack: List[int] = []
    pairs: Dict[int, int] = {}
    for m in _BRACE_TOKEN.finditer(text, start):
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
    r"|\\(?:text|mathrm|textrm)\s*\{[^{}$.]{0,40}(?:,|\band|\bor)\s*\}"
    r"|(?<![A-Za-z\\])[A-Za-z](?:_\{?\w{1,8}\}?)?\s*=)*"
)
_MAX_BOX_GAP = 80


def _plain_close(text: str, start: int) -> Optional[int]:
    """The ``}`` closing a brace opened just before ``start`` when no brace or backslash comes before
    it (``\\boxed{17}``: most boxes), else None: the first ``}`` is then its match (nothing between
    could be a token of :func:`_matching_braces`), without matching the whole text."""
    close = text.find("}", start, start + MAX_ANSWER_CHARS + 1)  # bounded: a longer box is no answer anyway
    if close < 0:
        return None
    inside = text[start:close]
    return None if "{" in inside or "\\" in inside else close


def _complete_boxes(text: str) -> List[tuple]:
    """Every complete, non-empty box of ``text`` as (start, end, content), in order."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return []
    pairs = None
    boxes = []
    for m in _BOXED_OPEN.finditer(text):
        close = _plain_close(text, m.end()) if pairs is None else pairs.get(m.end() - 1)
        if close is None and pairs is None:  # braces or backslashes inside: match the braces from here on
            pairs = _matching_braces(text, m.start())
            close = pairs.get(m.end() - 1)
        if close is not None:
            content = text[m.end() : close]
            if len(content) <= MAX_ANSWER_CHARS and content.strip():
                boxes.append((m.start(), close + 1, content))
    if "\\boxed " in text or "\\boxed\t" in text:  # a bare box needs one: most texts skip the scan
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


# math-verify's rule for the boxes of one answer (latex2sympy2_extended, math_normalization.py,
# extract_boxed_content): under 10 characters apart, or under 70 with a separator between them
_LIST_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")


def find_gold_boxes(text: str) -> List[str]:
    """Contents of every box of a gold's final answer: as :func:`find_final_boxes`, and also the boxes
    that a few words divide from the last (``\\boxed{1} papers and \\boxed{2} bins``), joined as
    math-verify joins a gold's boxes (within 10 characters, or 70 with "and" / "or" / "," / ";"
    between them): a gold does not hedge, so those boxes are all part of its answer."""
    boxes = _complete_boxes(text)
    if not boxes:
        return []
    group = _final_group(text, boxes)
    for box in reversed(boxes[: len(boxes) - len(group)]):
        gap = text[box[1] : group[0][0]]
        joined = len(gap) < 10 or (len(gap) < 70 and box[2].strip() != group[0][2].strip()
                                   and _LIST_SEPARATOR.search(gap))
        if len(group) >= _MAX_PARTS or not joined:
            break
        group.insert(0, box)
    return [content for _, _, content in group]


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


def join_boxes(contents: List[str]) -> str:
    """Several boxes as one answer: the set of their contents (``2, 5``), as math-verify reads it; a
    content written twice (``\\boxed{7}\\boxed{7}``) is one element."""
    if len(contents) == 1:
        return contents[0].strip()
    return ", ".join(dict.fromkeys(c.strip() for c in contents))


def last_answer_tag(text: str) -> Optional[str]:
    # rfind, not a regex: ".*?" between many unclosed tags would be quadratic.
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end]


def strip_math_delimiters(s: str) -> str:
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
    if not _LETTER.search(line):  # no word of prose (the usual "The answer is 18."): the line is the answer
        return line
    # "Final Answer: The largest $n$ is 34." states its answer inside a sentence: the answer is the
    # sentence's last math (a span or a number), not the sentence -- when only a few words follow it
    # ("... is 34", "... is $\\frac34$ square units"), not more math ("$0 + 0 = I am not sure").
    if _PROSE_WORD.search(_strip_spans(line)):
        last = _last_math_group(line)
        if last is not None and _FEW_WORDS.fullmatch(line[last[1]:]):
            return last[0]
    return line


_LETTER = re.compile(r"[A-Za-z]")
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


# The characters that IGNORECASE matches to an ASCII letter of ANSWER_PHRASE besides the letter's own
# two cases (Python's re documentation): where none occurs, a lower-cased copy finds the same words.
_FOLDED_TO_ASCII = ("\u0130", "\u0131", "\u017f", "\u212a")
_FOLDED_CHAR = re.compile("[" + "".join(_FOLDED_TO_ASCII) + "]")
_ANSWER_AT = re.compile(r"(?i)\banswer\s*(?:is\b\s*:?|:)[ \t]*")


def _last_phrase_match(text: str):
    """(start, end) of the last match of :data:`ANSWER_PHRASE` in ``text``, or None. Searched from the
    end for "answer" (a match ends with its only "answer", so the last match holds the last "answer"
    that one matches at): a response's answer phrase is in its last lines."""
    lower = text.lower()
    if not text.isascii() and (len(lower) != len(text) or _FOLDED_CHAR.search(text)):
        last = None
        for last in ANSWER_PHRASE.finditer(text):
            pass
        return None if last is None else last.span()
    at = len(lower)
    while True:
        at = lower.rfind("answer", 0, at)
        if at < 0:
            return None
        m = _ANSWER_AT.match(text, at)
        if m is not None:
            # the match starts at "final" when "final" and whitespace (re's \s: str.isspace) come before
            j = at
            while j > 0 and text[j - 1].isspace():
                j -= 1
            if j < at and lower.endswith("final", 0, j) and (j == 5 or not _word_char(text[j - 6])):
                return j - 5, m.end()
            return at, m.end()
        at += 5  # the next search ends before this "answer" starts


def _word_char(c: str) -> bool:
    return c.isalnum() or c == "_"  # re's \w for str patterns


def _last_phrase(text: str):
    last = _last_phrase_match(text)
    if last is None:
        return None
    value = _phrase_answer(text[last[1] : last[1] + 4 * MAX_ANSWER_CHARS])
    if value and _EMPTY_BOX.fullmatch(value):  # "The answer is $\\boxed{}$" states nothing
        value = None
    return (last[0], value) if value else None


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
        return AnswerCandidate(join_boxes(boxes), "boxed")
    inner = _phrase_or_gsm8k(tag)
    if inner is not None:
        return AnswerCandidate(inner.raw, "answer_tag")
    tag = strip_math_delimiters(tag)
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


def clear_search_memo() -> None:
    """Forget the texts searched lately (a benchmark's cold start)."""
    _recent.clear()
    _recent_chars[0] = 0


def _search_answer(text: str, require_anchor: bool) -> Optional[AnswerCandidate]:
    tag = last_answer_tag(text)
    if tag is not None:
        answer = _answer_in_tag(tag)
        if answer is not None and answer.raw:
            return answer
    all_boxes = _complete_boxes(text)
    if all_boxes:
        final = [content for _, _, content in _final_group(text, all_boxes)]
        found = _final_answer_after_boxes(text, all_boxes[-1][1]) or AnswerCandidate(join_boxes(final), "boxed")
    else:
        found = _phrase_or_gsm8k(text)
    if require_anchor:
        return found
    if found is None:
        found = _restated_program_output(text)
        if found is not None:
            return found
        last = find_last_expression(text)
        if last is None:
            return None
        found = AnswerCandidate(last, "fallback")
    return _value_stated_after(text, found) or found


# A tool-integrated response (ToRA, arXiv 2309.17452; Qwen2.5-Math's "tir" prompt): a program, what
# it printed in an ```output block, then a sentence stating the result.
_OUTPUT_BLOCK = re.compile(r"```output[ \t]*\n(.{0,100}?)\n?```", re.S)
_PRINTED_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
# a conclusion is a sentence or two; a longer tail is more reasoning, read by the last-expression rule
_CONCLUSION_CHARS = 400


def _plain_number(s: str) -> str:
    """``16.0`` -> ``16``, ``1,875`` -> ``1875``, ``+0.50`` -> ``0.5``: one spelling per number, by
    string rewriting only (never evaluated)."""
    s = s.replace(",", "").lstrip("+")
    if "." in s:
        s = s.rstrip("0").rstrip(".") or "0"
    return s


def _restated_program_output(text: str) -> Optional[AnswerCandidate]:
    """Evaluation mode, no anchor: the number the last ```output block printed, when the conclusion
    after it restates it, in digits or in words. "```output 5```  5 cars drove through the jam in
    the first 15 minutes." states 5, where the last number (15) restates the question; "```output
    3.0``` Three trucks will be needed for 80 flagstones." states 3 (both read as in ToRA's harness,
    which takes the program's output). A conclusion that does not restate the output (another
    number, a percentage of it) is left to the last-expression rule."""
    at = text.rfind("```output")
    if at < 0:
        return None
    m = _OUTPUT_BLOCK.match(text, at)
    if m is None or not _PRINTED_NUMBER.fullmatch(m.group(1).strip()):
        return None
    conclusion = text[m.end():]
    if len(conclusion) > _CONCLUSION_CHARS or "```" in conclusion:
        return None
    printed = _plain_number(m.group(1).strip())
    stated = [_plain_number(n.group()) for n in _LAST_NUMBER.finditer(conclusion)]
    stated += [number_word(w) for w in NUMBER_WORD.findall(conclusion)]
    return AnswerCandidate(printed, "fallback") if printed in stated else None


_FINAL_ANSWER = re.compile(r"(?i)final\s+answer")


def _final_answer_after_boxes(text: str, last_box_end: int) -> Optional[AnswerCandidate]:
    """A "final answer is X" phrase written after the last box (ending at ``last_box_end``; Minerva's
    "Final Answer: The final answer is $10,455$." after boxed intermediate results) states the answer,
    when X is math."""
    phrase_at = max(text.rfind("inal answer"), text.rfind("inal Answer"), text.rfind("INAL ANSWER"))
    if phrase_at < last_box_end:
        return None
    last = None
    for m in ANSWER_PHRASE.finditer(text, last_box_end):
        last = m
    if last is None or not _FINAL_ANSWER.search(text, max(last_box_end, last.start() - 16), last.end()):
        return None
    after = text[last.end() : last.end() + MAX_ANSWER_CHARS].lstrip(" \t*:")
    if not after.startswith(("$", "\\(", "\\[")):
        return None  # only a math span: "the final answer is correct" states nothing
    value = _phrase_answer(after)
    if not value or "\\boxed" in value or not re.search(r"\d", value):
        return None
    return AnswerCandidate(value, "phrase")


# "T = 12", "A=49": a letter given a number in the text
_GIVEN_VALUE = re.compile(r"(?<![A-Za-z\\])([A-Za-z])\s*=\s*[+-]?\d")
_FREE_LETTER = re.compile(r"(?<![A-Za-z\\])[A-Za-z](?![A-Za-z])")
# what is no unknown in a formula: text (units) and command names (\\sqrt, \\pi), not their arguments
_BRACED_COMMAND = re.compile(r"\\(?:text|mathrm|textrm|mbox|operatorname)\s*\{[^{}]*\}|\\[A-Za-z]+")


def _value_stated_after(text: str, found: AnswerCandidate) -> Optional[AnswerCandidate]:
    """Evaluation mode: an anchored answer that is a formula in letters the text gives numbers to
    (``$2+T$`` with ``T = 12`` stated, ``12(\\sqrt{A}-5)`` with ``A = 49``) is an intermediate
    expression when a number is written after it ("..., that is 14."): that number is the answer.
    A formula whose letters are unknowns (``x^2+1``) stays the answer: each letter must be given a
    number before the formula, or be a capital (a named constant, ``T``, ``A``) given one anywhere;
    "The answer is $x^2+1$. At x = 1 it is 2." keeps ``x^2+1``. A boxed answer is never replaced."""
    if found.source not in ("phrase", "fallback"):
        return None
    letters = set(_FREE_LETTER.findall(_BRACED_COMMAND.sub(" ", found.raw)))
    if not letters or "=" in found.raw or len(found.raw) > 200:
        return None
    tail = text[-_FALLBACK_TAIL:]
    at = tail.rfind(found.raw)
    if at < 0:
        return None
    before = set(_GIVEN_VALUE.findall(tail, 0, at))
    anywhere = before | set(_GIVEN_VALUE.findall(tail, at))
    if not all(c in before or (c.isupper() and c in anywhere) for c in letters):
        return None
    after = tail[at + len(found.raw):]
    last = _last_math_group(after)
    if last is None:
        # "..., which equals fourteen.": the number in words, in the sentence right after the formula
        sentence = _SENTENCE_BREAK.split(after, 1)[0][:200]
        words = NUMBER_WORD.findall(sentence)
        return AnswerCandidate(words[-1], "fallback") if words else None
    if _FREE_LETTER.search(_BRACED_COMMAND.sub(" ", last[0])) or not re.search(r"\d", last[0]):
        return None
    return AnswerCandidate(last[0], "fallback")


# --- the fallback without an anchor ------------------------------------------------------------

# Math delimiters, and the escaped dollar that is not one.
_MATH_DELIM = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSES = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
# A number written as prose, not a digit inside LaTeX (``\\frac{1}{2}``, ``x^2``, ``a_1``).
_LAST_NUMBER = re.compile(
    r"(?<![\w.\\{^_/])[+-]?(?:[1-9]\d{0,2}(?: \d{3})+(?![\d.,])|\d+(?:[.,]\d+)*|\.\d+)"
    r"(?:\s*/\s*\d+(?:\.\d+)?)?(?:(?![\w}^/])|(?=(?:[kcm]?m|[km]?g|m?[lL])[²³]?(?![\w}^/])))")
# a fraction in LaTeX in a text with no math delimiter at all ("so x is \frac{10}{9}"); in a text with
# delimiters it is inside a span (or inside one that never closes: a truncated answer, no answer)
_BARE_FRACTION = re.compile(r"[+-]?\\[dt]?frac\{[^{}$]{1,40}\}\{[^{}$]{1,40}\}")
_ANY_DELIM = re.compile(r"(?<!\\)\$|\\[(\[]|\\begin\s*\{|&=|\\\\")
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
        if not spans and "frac" in text and not _ANY_DELIM.search(text):
            items.extend((m.start(), m.end(), m.group()) for m in _BARE_FRACTION.finditer(text, pos, span[0]))
            items.sort()
        if span[2] is not None:
            items.append(span)
        pos = max(pos, span[1])
    return items


_LONE_SYMBOL = re.compile(r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?\w{1,8}\}?)?$")
_SENTENCE_BREAK = re.compile(r"[.!?](?:\s|$)|\n")
# between a number and the variable it counts: "14 possible values of $n$", "3 solutions for $x$"
_COUNTED_BY = re.compile(r"[ \t]+[A-Za-z][A-Za-z \t-]{0,40}\b(?:of|for)[ \t]*\$*")


def _last_math_group(text: str) -> Optional[tuple]:
    """(answer, end): the last math item of ``text`` with the items just before it that only separators
    divide from it (``$2$ and $5$`` -> ``2, 5``), and where it ends; None without math."""
    items = _math_items(text)
    # "there are 14 possible values of $n$": a lone variable named after a number of the same
    # sentence is what the number counts, not the answer
    while len(items) > 1 and _LONE_SYMBOL.match(items[-1][2]) and re.search(r"\d", items[-2][2]) \
            and _COUNTED_BY.fullmatch(text, items[-2][1], items[-1][0]):
        items.pop()
    if not items:
        return None
    group = _final_group(text, items)
    return join_boxes([g[2] for g in group]), group[-1][1]


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

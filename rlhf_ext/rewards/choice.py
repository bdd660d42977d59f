"""Choice and ranking answers: the gold format, extraction from model text, and grading.

Beside ``math`` (:class:`~rlhf_ext.rewards.MathGrader`): ``choice`` picks one of several labelled
options (GPQA-style); ``ranking`` orders every option, best first (``C > A > B``). A gold is a
mapping (or its JSON text) ``{"answer_type": "choice" | "ranking", "options": [...] | {label: text},
"answer": "B" | ["C", "A", "B"]}``; listed options are lettered ``A``, ``B``, ... in order; a ranking
without ``options`` takes its answer's labels (:func:`ranking_options`). Without ``answer_type`` a
list answer means ``ranking``, a label ``choice``; anything else is a math gold (None).

Where the final answer is looked for follows the math rules of :mod:`.extraction` (the anchor wins
over letters mentioned while reasoning), first hit wins:

1. the last ``<answer>...</answer>`` block: its final boxes, else an answer phrase inside it, else
   the whole block;
2. the boxes of the final answer (``\\boxed{B}``; ``\\boxed{A} and \\boxed{C}`` is two picks);
3. the last "the answer is" / "final answer:" / "Answer:" phrase: for a choice the rest of its
   line, for a ranking also the numbered list on the lines after it (``Final ranking:`` then
   ``1. C`` ``2. A`` ``3. B``);
4. a response that is nothing but an answer (``B``, ``(B)``, ``**B**``, ``C > A > B``);
5. with ``require_anchor=False`` only (evaluation): the last non-empty line, when it reads as an answer.

Outcomes are distinct, never a silent zero (:data:`STATUSES`): ``ok``; ``unparseable`` (no answer
found, or the text found is not a label); ``ambiguous`` (two different picks, or two different
rankings, in the final answer); ``invalid`` (a label not among the options; a ranking that repeats
or misses a candidate). A choice is read from its label (``B``, ``(B)``, ``**B**``, ``option B``,
``B: <text>``) or from its option text written out in full; a ranking from labels (or full option
texts) separated by ``>``, ``,``, ``;``, ``\\succ``, ``\\gt`` or new lines, with or without
``1.`` / ``1)`` numbering.

Partial credit for a ranking: Kendall's rank correlation (Kendall 1938, "A New Measure of Rank
Correlation", Biometrika 30) between the predicted and the gold order, tau = (concordant -
discordant) / (n (n-1) / 2); both orders are strict and complete, so tau-a = tau-b. Mapped to
[0, 1] as (1 + tau) / 2 it is the fraction of candidate pairs put in the right order, i.e. one
minus the normalized bubble-sort (Kendall tau) distance. It is chosen over Spearman's rho because
every swapped pair costs the same whatever the positions, which suits "is A better than B"
judgements, and it is defined for n = 2. See :func:`ranking_partial_score` for the top-1 term.

Pure string work, nothing evaluated, linear in the text length apart from the option-text match
(options x text): safe on hostile model output.
"""

from __future__ import annotations

import json
import re
from collections import abc
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .answer_finding import ANSWER_PHRASE, MAX_ANSWER_CHARS, find_final_boxes, join_boxes, last_answer_tag

ANSWER_TYPES = ("math", "choice", "ranking")
STRUCTURED_TYPES = ("choice", "ranking")
STATUSES = ("ok", "unparseable", "ambiguous", "invalid")
MAX_OPTIONS = 26 * 2
_LABEL_RE = re.compile(r"[A-Za-z0-9]{1,8}")


class GoldFormatError(ValueError):
    """A choice or ranking gold that is malformed (unknown answer label, repeated label...)."""


@dataclass(frozen=True)
class Options:
    """Option labels in their order and the text of each (``""`` when only labels are given)."""

    labels: Tuple[str, ...]
    texts: Tuple[str, ...]

    def text_of(self, label: str) -> str:
        return self.texts[self.labels.index(label)]


def letters(n: int) -> Tuple[str, ...]:
    """``A``, ``B``, ... for ``n`` options (``AA``... never: more than 52 options is an error)."""
    if n > MAX_OPTIONS:
        raise GoldFormatError(f"at most {MAX_OPTIONS} options, got {n}")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    return tuple(alphabet[:n])


def parse_options(options) -> Options:
    """``["x", "y"]`` -> labels A, B; ``{"A": "x", "B": "y"}`` -> those labels; errors name the problem."""
    if isinstance(options, Mapping):
        labels, texts = [], []
        for label, text in options.items():
            label = str(label).strip()
            if not _LABEL_RE.fullmatch(label):
                raise GoldFormatError(f"option label {label!r}: use 1-8 letters or digits")
            labels.append(label)
            texts.append("" if text is None else str(text).strip())
    elif isinstance(options, (list, tuple)):
        labels = list(letters(len(options)))
        texts = ["" if t is None else str(t).strip() for t in options]
    else:
        raise GoldFormatError(f"'options' must be a list or an object of label: text, got {type(options).__name__}")
    if len(labels) < 2:
        raise GoldFormatError(f"need at least 2 options, got {len(labels)}")
    if len(set(labels)) != len(labels):
        raise GoldFormatError(f"repeated option label in {labels}")
    if len({lab.upper() for lab in labels}) != len(labels):
        raise GoldFormatError(f"option labels that differ only in case are not readable apart: {labels}")
    return Options(tuple(labels), tuple(texts))


@dataclass(frozen=True)
class StructuredGold:
    """A choice or ranking gold: its type, options and answer (one label, or every label in order)."""

    answer_type: str
    options: Options
    answer: Tuple[str, ...]

    def as_label(self) -> dict:
        """The JSON form (a dataset label that :func:`parse_structured_gold` reads back)."""
        opts = dict(zip(self.options.labels, self.options.texts))
        answer = self.answer[0] if self.answer_type == "choice" else list(self.answer)
        return {"answer_type": self.answer_type, "options": opts, "answer": answer}


def _looks_structured(gold) -> Optional[Mapping]:
    if isinstance(gold, str):
        if '"options"' in gold or '"answer_type"' in gold or '"answer"' in gold:
            s = gold.strip()
            if s.startswith("{") and s.endswith("}"):
                try:
                    value = json.loads(s)
                except json.JSONDecodeError:
                    return None
                return value if isinstance(value, dict) else None
        return None
    # collections.abc's class, not typing's alias: its isinstance is a cached C check (one sample a call)
    return gold if isinstance(gold, abc.Mapping) else None


def parse_structured_gold(gold, answer_type: Optional[str] = None) -> Optional[StructuredGold]:
    """A choice/ranking gold from a mapping or its JSON text; None for a math gold.

    Raises :class:`GoldFormatError` for a gold that is structured but malformed: an answer label
    not among the options, a ranking that repeats or misses an option, an unknown answer type.
    """
    spec = _looks_structured(gold)
    if spec is None:
        if answer_type in STRUCTURED_TYPES:
            raise GoldFormatError(f"a {answer_type} gold must be an object with 'options' and 'answer', got "
                                  f"{str(gold)[:80]!r}")
        return None
    kind = spec.get("answer_type", answer_type)
    if "options" not in spec and kind is None and not isinstance(spec.get("answer"), (list, tuple)):
        return None  # {"answer": "42"}: no sign of a choice or a ranking
    if "answer" not in spec:
        raise GoldFormatError("a choice/ranking gold needs an 'answer'")
    answer = spec["answer"]
    if kind is None:
        kind = "ranking" if isinstance(answer, (list, tuple)) else "choice"
    if kind not in STRUCTURED_TYPES:
        raise GoldFormatError(f"answer_type must be one of {', '.join(STRUCTURED_TYPES)}, got {kind!r}")
    if "options" not in spec and kind == "choice":
        raise GoldFormatError("a choice gold needs 'options' (the answer names one of them)")
    options = parse_options(spec["options"]) if "options" in spec else ranking_options(answer)
    return StructuredGold(kind, options, _gold_answer(kind, answer, options))


_RANK_SEPARATOR = re.compile(r"\s*(?:>|≻|,|;|\s)\s*")


def ranking_options(answer) -> Options:
    """A ranking gold's options when it names none: the labels its answer orders (a ranking orders
    every option once), sorted: ``["C", "A", "B"]`` / ``"C > A > B"`` -> A, B, C without texts."""
    if not isinstance(answer, (str, list, tuple)):
        raise GoldFormatError(f"a ranking answer is a list of labels, got {type(answer).__name__}")
    labels = ([t for t in _RANK_SEPARATOR.split(answer.strip()) if t] if isinstance(answer, str)
              else [str(a).strip() for a in answer])
    repeated = sorted({lab for lab in labels if labels.count(lab) > 1})
    if repeated:
        raise GoldFormatError(f"ranking answer {answer!r} repeats {', '.join(repeated)} (no 'options' given)")
    return parse_options({lab: "" for lab in sorted(labels)})


def _gold_answer(kind: str, answer, options: Options) -> Tuple[str, ...]:
    if kind == "choice":
        if isinstance(answer, (list, tuple)):
            if len(answer) != 1:
                raise GoldFormatError(f"a choice answer is one label, got {answer!r}")
            answer = answer[0]
        label = _gold_label(answer, options)
        return (label,)
    if isinstance(answer, str):
        parsed = parse_ranking_text(answer, options)
        if parsed.status != "ok":
            raise GoldFormatError(f"ranking answer {answer!r}: {parsed.status} ({parsed.detail})")
        return parsed.order
    if not isinstance(answer, (list, tuple)):
        raise GoldFormatError(f"a ranking answer is a list of labels, got {type(answer).__name__}")
    order = tuple(_gold_label(a, options) for a in answer)
    if len(set(order)) != len(order) or len(order) != len(options.labels):
        raise GoldFormatError(f"ranking answer {list(answer)} must name each of {list(options.labels)} once")
    return order


def _gold_label(value, options: Options) -> str:
    s = str(value).strip()
    if s in options.labels:
        return s
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(options.labels):
        return options.labels[value]  # an index into a list of options
    raise GoldFormatError(f"answer {value!r} is not one of the option labels {list(options.labels)}")


# --- reading one label ---------------------------------------------------------------------------

_MARKUP = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_OPTION_WORD = re.compile(r"(?i)^(?:the\s+)?(?:option|choice|candidate|answer|letter)\s*:?\s*")
_WRAPPED = re.compile(r"^[\(\[]\s*([A-Za-z0-9]{1,8})\s*[\)\]]")
_LEADING = re.compile(r"^([A-Za-z0-9]{1,8})(?=$|[\s.,:;!?)\]]|\*)")
_TRAIL = " \t\n.,;:!?*'\"`$"


def _clean(s: str) -> str:
    s = _MARKUP.sub(r"\1", s)
    s = s.replace("**", "").replace("__", "")
    s = s.strip().strip("$").strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2].strip()
    return s.strip(" \t\n*`'\"")


def _norm_text(s: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", s.casefold()).split())


def _label_shaped(token: str, options: Options) -> bool:
    """Could ``token`` be meant as a label? A single letter, or the shape of the options' labels."""
    if len(token) == 1 and token.isalpha():
        return True
    if all(lab.isdigit() for lab in options.labels):
        return token.isdigit() and len(token) <= 3
    return any(len(token) == len(lab) and token.isalpha() == lab.isalpha() and token.isupper() == lab.isupper()
               for lab in options.labels) and not token.islower()


def _match_label(token: str, options: Options, strict: bool) -> Optional[str]:
    if token in options.labels:
        return token
    if strict:  # "(b)", "\boxed{b}": case does not matter when the token is all there is
        for lab in options.labels:
            if lab.upper() == token.upper():
                return lab
    return None


@dataclass(frozen=True)
class _Read:
    status: str  # ok / unparseable / invalid
    label: Optional[str]
    rest: str
    detail: str = ""


def _read_label(s: str, options: Options, whole: bool = False) -> _Read:
    """The label that ``s`` starts with: ``B``, ``(B)``, ``option B``, ``B: text``, or a full option text."""
    s = _clean(s)
    s = _OPTION_WORD.sub("", s, count=1)
    if not s:
        return _Read("unparseable", None, "", "empty answer")
    norm = _norm_text(s)
    for lab, text in zip(options.labels, options.texts):
        if text and norm == _norm_text(text):
            return _Read("ok", lab, "")
    m = _WRAPPED.match(s)
    strict = m is not None
    if m is None:
        m = _LEADING.match(s)
    if m is not None:
        token = m.group(1)
        rest = s[m.end():]
        alone = not rest.strip(_TRAIL)
        label = _match_label(token, options, strict or alone)
        if label is not None:
            # "A is" / "a few": a lowercase word that happens to be a label is not a pick
            if strict or alone or not token.islower():
                return _Read("ok", label, rest)
        if _label_shaped(token, options) and (strict or alone or rest[:1] in ".:)") and \
                not (token.islower() and not strict):
            return _Read("invalid", None, rest, f"{token!r} is not one of the options {list(options.labels)}")
    for lab, text in zip(options.labels, options.texts):  # "Paris." / "Paris, because ..."
        if text and norm.startswith(_norm_text(text) + " ") and not whole:
            return _Read("ok", lab, s[len(text):])
    return _Read("unparseable", None, s, f"{s[:40]!r} is not an option label")


_ALTERNATIVE = re.compile(r"^\s*(?:,|;|/|&|\band\b|\bor\b|\bthen\b)\s*", re.I)


def parse_choice_text(content: str, options: Options, whole: bool = False) -> "ChoiceParse":
    """Read the pick stated by an answer's text (already located: a box, a tag, a phrase's rest).

    ``whole``: the text must be the answer and nothing else (a label, perhaps followed by its option
    text): how a response without an anchor is read, so that prose starting with a letter is no pick.
    """
    first = _read_label(content, options, whole=whole)
    if first.status != "ok":
        return ChoiceParse(first.status, None, None, first.detail)
    rest = first.rest
    if whole:
        tail = _norm_text(rest)
        if tail and tail != _norm_text(options.text_of(first.label)):
            return ChoiceParse("unparseable", None, None, "more than an answer")
    m = _ALTERNATIVE.match(rest)
    if m is not None:  # "A and C", "A, C", "A or B": a second pick in the final answer
        second = _read_label(rest[m.end():], options)
        if second.status == "ok" and second.label != first.label:
            return ChoiceParse("ambiguous", None, None, f"both {first.label} and {second.label}")
    return ChoiceParse("ok", first.label, None)


# --- rankings ------------------------------------------------------------------------------------

_RANK_SEP = re.compile(r"\s*(?:>|≻|\\succ\b|\\gt\b|,|;|\n|\\\\|→|->)\s*")
_NUMBERING = re.compile(r"(?:(?<=\s)|^)(?:\(?\d{1,2}[.)]|#\d{1,2}:?|(?:rank|place)\s*\d{1,2}:)\s+", re.I)
_RANK_OR = re.compile(r"\s+or\s+", re.I)


def _ranking_pieces(content: str, options: Options) -> List[str]:
    s = _clean(content)
    if not all(lab.isdigit() for lab in options.labels):
        s = _NUMBERING.sub("\n", s)
    return [p for p in (x.strip(_TRAIL) for x in _RANK_SEP.split(s)) if p]


def parse_ranking_text(content: str, options: Options) -> "RankingParse":
    """Read the order stated by an answer's text: labels (or full option texts) in order, best first."""
    alternatives = _RANK_OR.split(content.strip()) if _RANK_OR.search(content) else [content]
    if len(alternatives) > 1:
        parsed = [parse_ranking_text(a, options) for a in alternatives]
        if all(p.status == "ok" for p in parsed) and len({p.order for p in parsed}) > 1:
            return RankingParse("ambiguous", None, None, f"{len(parsed)} different rankings")
        if all(p.status == "ok" for p in parsed):
            return parsed[0]
    pieces = _ranking_pieces(content, options)
    if not pieces:
        return RankingParse("unparseable", None, None, "empty answer")
    order = []
    for piece in pieces:
        r = _read_label(piece, options, whole=True)
        if r.status != "ok":
            return RankingParse("unparseable" if r.status == "unparseable" else "invalid", None, None, r.detail)
        if r.rest.strip(_TRAIL):
            words = piece.split()
            if len(pieces) == 1 and len(words) > 1 and all(_read_label(w, options, whole=True).status == "ok"
                                                           for w in words):
                return parse_ranking_text(" > ".join(words), options)  # "C A B": labels side by side
            return RankingParse("unparseable", None, None, f"{piece[:40]!r} is not one option")
        order.append(r.label)
    repeated = sorted({lab for lab in order if order.count(lab) > 1})
    if repeated:
        return RankingParse("invalid", None, None, f"repeats {', '.join(repeated)}")
    missing = [lab for lab in options.labels if lab not in order]
    if missing:
        return RankingParse("invalid", None, None, f"misses {', '.join(missing)}")
    return RankingParse("ok", tuple(order), None)


# --- locating the final answer -----------------------------------------------------------------


@dataclass(frozen=True)
class ChoiceParse:
    status: str
    label: Optional[str]
    source: Optional[str]
    detail: str = ""


@dataclass(frozen=True)
class RankingParse:
    status: str
    order: Optional[Tuple[str, ...]]
    source: Optional[str]
    detail: str = ""


# a ranking may also be announced as one ("Final ranking:", "the order is")
_RANKING_PHRASE = re.compile(r"(?i)\b(?:final\s+)?(?:answer|ranking|order)\s*(?:is\b\s*:?|:)[ \t]*")
_LIST_LINE = re.compile(r"^\s*(?:[-*]|\(?\d{1,2}[.)]|#\d{1,2}:?)\s*\S")


def _phrase_content(text: str, ranking: bool) -> Optional[str]:
    last = None
    for m in (_RANKING_PHRASE if ranking else ANSWER_PHRASE).finditer(text):
        last = m
    if last is None:
        return None
    after = text[last.end(): last.end() + 4 * MAX_ANSWER_CHARS]
    line, _, more = after.partition("\n")
    if ranking:  # "Final ranking:" followed by a list on the next lines
        lines = [line] if line.strip() else []
        for nxt in more.split("\n"):
            if _LIST_LINE.match(nxt):
                lines.append(nxt)
            elif nxt.strip() or len(lines) > (1 if line.strip() else 0):
                break
        content = "\n".join(lines)
    else:
        content = line
        # "B. Because ..." / "B because": the pick is what starts the line; the rest is read there
    content = content.strip()
    return content[:MAX_ANSWER_CHARS] or None


def _boxes_content(boxes: List[str], ranking: bool) -> str:
    """The final boxes as one answer: picks side by side (``\\boxed{A} \\boxed{C}``: two picks, or a
    ranking one box per place); several boxed rankings are alternatives (``C > A > B`` or ``A > C > B``)."""
    if ranking and len(boxes) > 1 and any(_RANK_SEP.search(b.strip()) for b in boxes):
        return " or ".join(b.strip() for b in boxes)
    return join_boxes(boxes)


def _candidates(text: str, ranking: bool, require_anchor: bool) -> List[Tuple[str, str]]:
    """(content, source) of the final answer by the precedence of the module docstring; the first
    that states anything is used (an empty tag falls through, as for math)."""
    out = []
    tag = last_answer_tag(text)
    if tag is not None:
        boxes = find_final_boxes(tag)
        if boxes:
            out.append((_boxes_content(boxes, ranking), "boxed"))
        else:
            phrase = _phrase_content(tag, ranking)
            if phrase:
                out.append((phrase, "answer_tag"))
            elif len(tag) <= MAX_ANSWER_CHARS:  # a longer block is no final answer (and stays cheap to read)
                out.append((tag.strip(), "answer_tag"))
    boxes = find_final_boxes(text)
    if boxes:
        out.append((_boxes_content(boxes, ranking), "boxed"))
    phrase = _phrase_content(text, ranking)
    if phrase:
        out.append((phrase, "phrase"))
    whole = text.strip()
    if whole and len(whole) <= 200:
        out.append((whole, "bare"))
    if not require_anchor:
        lines = [ln for ln in text.strip().split("\n") if ln.strip()]
        if lines:
            out.append((lines[-1][-MAX_ANSWER_CHARS:], "last_line"))
    return out


def extract_choice(text: str, options: Options, require_anchor: bool = True) -> ChoiceParse:
    """The pick of ``text`` among ``options`` (see the module docstring for where it is looked for)."""
    if not isinstance(text, str) or not text.strip():
        return ChoiceParse("unparseable", None, None, "empty response")
    for content, source in _candidates(text, False, require_anchor):
        if not content.strip():
            continue
        parsed = parse_choice_text(content, options, whole=source in ("bare", "last_line"))
        if source in ("bare", "last_line") and parsed.status == "unparseable":
            continue  # prose that is not an answer: no anchor, nothing stated
        return ChoiceParse(parsed.status, parsed.label, source, parsed.detail)
    return ChoiceParse("unparseable", None, None, "no final answer found")


def extract_ranking(text: str, options: Options, require_anchor: bool = True) -> RankingParse:
    """The order of ``options`` stated by ``text``, best first."""
    if not isinstance(text, str) or not text.strip():
        return RankingParse("unparseable", None, None, "empty response")
    for content, source in _candidates(text, True, require_anchor):
        if not content.strip():
            continue
        parsed = parse_ranking_text(content, options)
        if source in ("bare", "last_line") and parsed.status == "unparseable":
            continue
        return RankingParse(parsed.status, parsed.order, source, parsed.detail)
    return RankingParse("unparseable", None, None, "no final answer found")


# --- grading -------------------------------------------------------------------------------------


def kendall_tau(predicted: Sequence[str], gold: Sequence[str]) -> float:
    """Kendall's tau between two strict, complete orders of the same items (Kendall 1938):
    (concordant - discordant) / (n (n - 1) / 2); 1 for the same order, -1 for the reverse."""
    if sorted(predicted) != sorted(gold) or len(set(gold)) != len(gold):
        raise ValueError(f"kendall_tau needs two orders of the same distinct items, got {predicted} and {gold}")
    n = len(gold)
    if n < 2:
        raise ValueError("kendall_tau needs at least 2 items")
    pos = {item: i for i, item in enumerate(predicted)}
    ranks = [pos[item] for item in gold]
    discordant = sum(1 for i in range(n) for j in range(i + 1, n) if ranks[i] > ranks[j])
    pairs = n * (n - 1) // 2
    return (pairs - 2 * discordant) / pairs


def ranking_partial_score(predicted: Sequence[str], gold: Sequence[str], top1_weight: float = 0.5) -> float:
    """``(1 - w) * (1 + tau) / 2 + w * [predicted best == gold best]``, in [0, 1]; 1 only for the exact order.

    (1 + tau) / 2 is the fraction of candidate pairs ordered right; the top-1 term adds the credit
    of the pick the ranking makes, the decision a ranking is usually for (selection accuracy).
    ``w = top1_weight`` in [0, 1].
    """
    if not 0.0 <= top1_weight <= 1.0:
        raise ValueError(f"top1_weight must be in [0, 1], got {top1_weight!r}")
    tau = kendall_tau(predicted, gold)
    return (1.0 - top1_weight) * (1.0 + tau) / 2.0 + top1_weight * (1.0 if predicted[0] == gold[0] else 0.0)


@dataclass(frozen=True)
class ChoiceGrade:
    """The verdict on one choice or ranking response; the attributes of
    :class:`~rlhf_ext.rewards.GradeResult` (``correct``, ``extracted``, ``gold_parsed``, ``timeout``,
    ``error``) mean the same here, so weighted rewards and evalkit treat both alike.

    ``status``: one of :data:`STATUSES` (or ``bad_gold``). ``extracted``: the pick (``B``) or the
    order (``C>A>B``), the majority-vote key. ``correct``: the right pick, or the exact order.
    ``top1``: the pick (a ranking's first place) is the gold's. ``tau``: Kendall's tau of a parsed
    ranking against the gold (None for choices and failures).
    """

    answer_type: str
    status: str
    extracted: Optional[str]
    correct: bool
    top1: bool
    tau: Optional[float]
    gold_parsed: bool
    source: Optional[str] = None
    detail: str = ""
    timeout: bool = False
    error: Optional[str] = None

    @property
    def parse_failed(self) -> bool:
        return self.gold_parsed and self.status != "ok"

    def as_dict(self) -> dict:
        return asdict(self)


def ranking_key(order: Sequence[str]) -> str:
    return ">".join(order)


def grade_structured(text: str, gold: StructuredGold, require_anchor: bool = True) -> ChoiceGrade:
    """Grade one response against a choice or ranking gold; never raises for any text."""
    if gold.answer_type == "choice":
        p = extract_choice(text, gold.options, require_anchor)
        ok = p.status == "ok"
        right = ok and p.label == gold.answer[0]
        return ChoiceGrade("choice", p.status, p.label, right, right, None, True, p.source, p.detail)
    r = extract_ranking(text, gold.options, require_anchor)
    if r.status != "ok":
        return ChoiceGrade("ranking", r.status, None, False, False, None, True, r.source, r.detail)
    return ChoiceGrade("ranking", "ok", ranking_key(r.order), r.order == gold.answer, r.order[0] == gold.answer[0],
                       kendall_tau(r.order, gold.answer), True, r.source)


def grade_any_structured(text: str, gold, answer_type: Optional[str] = None,
                         require_anchor: bool = True) -> Optional[ChoiceGrade]:
    """:func:`grade_structured` for a raw gold (mapping or JSON text); None when the gold is a math
    gold; a malformed structured gold grades as wrong with ``gold_parsed=False`` and the reason."""
    try:
        parsed = parse_structured_gold(gold, answer_type)
    except GoldFormatError as exc:
        kind = answer_type if answer_type in STRUCTURED_TYPES else "choice"
        return ChoiceGrade(kind, "bad_gold", None, False, False, None, False, None, str(exc), error=str(exc))
    if parsed is None:
        return None
    return grade_structured(text, parsed, require_anchor)


def shuffled_gold(gold: StructuredGold, permutation: Sequence[int]) -> Tuple[StructuredGold, Dict[str, str]]:
    """The gold with its options shown in another order and re-lettered: shown option ``i`` is original
    option ``permutation[i]``, under the original ``i``-th label. Returns the shown gold and the map
    shown label -> original label (what a record keeps to map answers back)."""
    labels = gold.options.labels
    if sorted(permutation) != list(range(len(labels))):
        raise ValueError(f"not a permutation of {len(labels)} options: {list(permutation)}")
    shown_to_orig = {labels[i]: labels[j] for i, j in enumerate(permutation)}
    orig_to_shown = {v: k for k, v in shown_to_orig.items()}
    options = Options(labels, tuple(gold.options.texts[j] for j in permutation))
    answer = tuple(orig_to_shown[a] for a in gold.answer)
    return StructuredGold(gold.answer_type, options, answer), shown_to_orig


def map_grade_labels(grade: ChoiceGrade, shown_to_orig: Mapping[str, str]) -> ChoiceGrade:
    """``grade`` with its extracted pick/order written in the original labels (for votes across samples)."""
    if grade.extracted is None:
        return grade
    if grade.answer_type == "choice":
        key = shown_to_orig[grade.extracted]
    else:
        key = ranking_key([shown_to_orig[x] for x in grade.extracted.split(">")])
    return ChoiceGrade(**{**asdict(grade), "extracted": key})


def render_options(question: str, options: Options) -> str:
    """The question followed by one ``A. text`` line per option (a label alone when it has no text)."""
    lines = [f"{lab}. {text}" if text else lab for lab, text in zip(options.labels, options.texts)]
    return question.rstrip() + "\n\n" + "\n".join(lines)

"""Open-R1's rule rewards (all but code execution), plus the truncation and answer-format terms.

Source of the semantics: huggingface/open-r1 ``src/open_r1/rewards.py`` (and its ``configs.py`` for
defaults). Every function takes ``completions`` as plain strings or in Open-R1's chat form
(``[[{"role": "assistant", "content": ...}]]``) and returns one float per completion.

Deliberate differences from Open-R1, all so that a reward inside a training job reports instead of
guessing:

* A gold without a parseable answer scores as *wrong* (``accuracy`` 0.0; ``length``/``cosine`` take
  the wrong-answer branch) and is reported by the grader (``gold_parsed=False``). Open-R1 returns
  ``None`` (accuracy) or treats it as correct (length, cosine), which OpenRLHF cannot consume.
* Correctness comes from :class:`~rlhf_ext.rewards.MathGrader` (see
  :mod:`~rlhf_ext.rewards.math_verify_recipe`), always as ``verify(gold, answer)``; Open-R1's
  ``len_reward`` and ``cosine_scaled_reward`` call ``verify(answer, gold)``, the wrong way round.
* ``format`` is Open-R1's regex, evaluated by an equivalent linear-time scan (the regex backtracks
  quadratically on degenerate repetitions of its tags).
* ``cosine`` uses the function defaults of ``get_cosine_scaled_reward`` (wrong: -1.0 .. -0.5);
  Open-R1's ``GRPOScriptArguments`` overrides ``cosine_min_value_wrong`` to 0.0.
* ``soft_overlong_punishment`` measures tokens when given ``completion_lengths`` or
  ``completion_ids`` (Open-R1 passes ``completion_ids``), characters otherwise.
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Sequence

from .extraction import find_answer_candidate
from .registry import register_reward


def completion_texts(completions: Sequence) -> List[str]:
    """Plain strings from completions given as strings, ``{"content": ...}`` or Open-R1's chat form."""
    texts = []
    for i, c in enumerate(completions):
        if isinstance(c, str):
            texts.append(c)
        elif isinstance(c, dict) and isinstance(c.get("content"), str):
            texts.append(c["content"])
        elif isinstance(c, (list, tuple)) and c and isinstance(c[0], dict) and isinstance(c[0].get("content"), str):
            texts.append(c[0]["content"])
        else:
            raise TypeError(f"completions[{i}] must be a str or a chat message list, got {type(c).__name__}")
    return texts


def _check_lengths(name: str, texts: Sequence, other: Optional[Sequence], what: str) -> None:
    if other is not None and len(other) != len(texts):
        raise ValueError(f"{name}: got {len(texts)} completions but {len(other)} {what}")


def supplied_grades(name: str, texts: List[str], solution, grades) -> Optional[list]:
    """The caller's ``grades`` (checked against ``texts``), or None once ``solution`` is checked to fit."""
    if grades is not None:
        _check_lengths(name, texts, grades, "grades")
        return list(grades)
    if solution is None:
        raise ValueError(f"{name} needs the gold answers: pass solution=[...] (or grades=[...])")
    _check_lengths(name, texts, solution, "solutions")
    return None


def _grades_for(name: str, texts: List[str], solution, grades, grader) -> list:
    supplied = supplied_grades(name, texts, solution, grades)
    if supplied is not None:
        return supplied
    if not texts:
        return []
    if grader is None:
        from .grader import default_grader

        grader = default_grader()
    return grader.grade_batch(texts, list(solution))


def _accuracy_one(text, grade, truncated) -> float:
    return 1.0 if grade.correct else 0.0


@register_reward("accuracy", uses_correctness=True, per_sample=True, one=_accuracy_one)
def accuracy_reward(completions, solution=None, *, grades=None, grader=None, **kwargs) -> List[float]:
    """1.0 when math-verify finds the final answer equal to the gold, else 0.0 (Open-R1 ``accuracy_reward``)."""
    texts = completion_texts(completions)
    return [_accuracy_one(None, g, None) for g in _grades_for("accuracy", texts, solution, grades, grader)]


def format_matches(text: str) -> bool:
    """Whether ``re.match(r"^<think>\\n.*?\\n</think>\\n<answer>\\n.*?\\n</answer>$", text, DOTALL | MULTILINE)``.

    Same answer as that regex, in one linear scan: the earliest ``\\n</think>\\n<answer>\\n`` after the
    opening tag is the best split, and MULTILINE's ``$`` accepts ``\\n</answer>`` followed by the end
    of the text or a newline.
    """
    if not text.startswith("<think>\n"):
        return False
    middle = "\n</think>\n<answer>\n"
    p = text.find(middle, len("<think>\n"))
    if p < 0:
        return False
    close = "\n</answer>"
    q = text.find(close, p + len(middle))
    while q >= 0:
        end = q + len(close)
        if end == len(text) or text[end] == "\n":
            return True
        q = text.find(close, q + 1)
    return False


def _format_one(text, grade, truncated) -> float:
    return 1.0 if format_matches(text) else 0.0


@register_reward("format", per_sample=True, one=_format_one)
def format_reward(completions, **kwargs) -> List[float]:
    """1.0 if the completion is ``<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>`` (Open-R1 ``format_reward``)."""
    return [_format_one(t, None, None) for t in completion_texts(completions)]


def _tag_count_one(text, grade, truncated) -> float:
    return 0.25 * sum(text.count(tag) == 1 for tag in ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>"))


@register_reward("tag_count", per_sample=True, one=_tag_count_one)
def tag_count_reward(completions, **kwargs) -> List[float]:
    """0.25 for each of ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``, ``\\n</answer>`` present exactly once.

    Open-R1 ``tag_count_reward`` (after willccbb's GRPO demo).
    """
    return [_tag_count_one(t, None, None) for t in completion_texts(completions)]


_STEP_MARKERS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")


@register_reward("reasoning_steps", per_sample=True)
def reasoning_steps_reward(completions, **kwargs) -> List[float]:
    """min(1, markers / 3) for step markers ("Step 1:", numbered lines, bullets, "First," ...); Open-R1's regex.

    As in Open-R1, ``^\\d+\\.`` has no MULTILINE flag, so a numbered list counts only at the very start.
    """
    return [min(1.0, len(_STEP_MARKERS.findall(t)) / 3) for t in completion_texts(completions)]


@register_reward("length", uses_correctness=True)
def length_reward(completions, solution=None, *, grades=None, grader=None, **kwargs) -> List[float]:
    """Kimi 1.5 length reward (arXiv 2501.12599, section 2.3.3), as Open-R1 ``len_reward``.

    lambda = 0.5 - (L - min_L) / (max_L - min_L) over the batch, L in characters; correct answers get
    lambda, wrong ones min(0, lambda); all zeros when every length is equal. Batch-relative: called
    on one sample at a time (OpenRLHF's ``reward_func``) it is always 0.
    """
    texts = completion_texts(completions)
    verdicts = _grades_for("length", texts, solution, grades, grader)
    if not texts:
        return []
    lengths = [len(t) for t in texts]
    lo, hi = min(lengths), max(lengths)
    if lo == hi:
        return [0.0] * len(texts)
    out = []
    for length, g in zip(lengths, verdicts):
        lam = 0.5 - (length - lo) / (hi - lo)
        out.append(float(lam if g.correct else min(0.0, lam)))
    return out


def check_finite(name: str, **values) -> None:
    """Raise ``ValueError`` naming the reward ``name`` and the option unless every value is a finite number."""
    for key, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name}: {key} must be a finite number, got {v!r}")


@register_reward("cosine", uses_correctness=True, per_sample=True)
def cosine_scaled_reward(completions, solution=None, *, grades=None, grader=None, min_value_wrong: float = -1.0,
                         max_value_wrong: float = -0.5, min_value_correct: float = 0.5, max_value_correct: float = 1.0,
                         max_len: int = 1000, **kwargs) -> List[float]:
    """Cosine length scaling (Yeo et al., arXiv 2502.03373, "Demystifying Long CoT"), as Open-R1.

    With progress = L / max_len (L in characters) and c = cos(pi * progress):
    correct: min_c + (max_c - min_c) * (1 + c) / 2 (short correct answers earn most);
    wrong:   max_w + (min_w - max_w) * (1 + c) / 2 (short wrong answers are punished most).
    Lengths past max_len keep following the cosine, as in Open-R1.
    """
    check_finite("cosine", min_value_wrong=min_value_wrong, max_value_wrong=max_value_wrong,
            min_value_correct=min_value_correct, max_value_correct=max_value_correct, max_len=max_len)
    if max_len <= 0:
        raise ValueError(f"cosine: max_len must be positive, got {max_len!r}")
    texts = completion_texts(completions)
    out = []
    for text, g in zip(texts, _grades_for("cosine", texts, solution, grades, grader)):
        cosine = math.cos(len(text) / max_len * math.pi)
        if g.correct:
            lo, hi = min_value_correct, max_value_correct
        else:  # swapped on purpose: the longer a wrong answer, the milder its penalty
            lo, hi = max_value_wrong, min_value_wrong
        out.append(float(lo + 0.5 * (hi - lo) * (1.0 + cosine)))
    return out


@register_reward("repetition_penalty", per_sample=True)
def repetition_penalty_reward(completions, *, ngram_size: int = 3, max_penalty: float = -1.0, language: str = "en",
                              **kwargs) -> List[float]:
    """N-gram repetition penalty (arXiv 2502.03373, appendix C.2), as Open-R1.

    (1 - distinct n-grams / n-grams) * max_penalty; 0 for texts shorter than n words. Words are
    lower-cased whitespace tokens for ``language="en"``, and jieba's segmentation (every segment,
    punctuation and spaces included, as Open-R1 counts them) for ``language="zh"``; jieba is an
    optional dependency (``pip install rlhf_ext[zh]``).
    """
    if isinstance(ngram_size, bool) or not isinstance(ngram_size, int) or ngram_size < 1:
        raise ValueError(f"repetition_penalty: ngram_size must be a positive integer, got {ngram_size!r}")
    check_finite("repetition_penalty", max_penalty=max_penalty)
    if max_penalty > 0:
        raise ValueError(f"repetition_penalty: max_penalty {max_penalty} should not be positive")
    split = _word_splitter(language)
    out = []
    for text in completion_texts(completions):
        words = split(text)
        if len(words) < ngram_size:
            out.append(0.0)
            continue
        ngrams = list(zip(*[words[i:] for i in range(ngram_size)]))
        out.append((1 - len(set(ngrams)) / len(ngrams)) * max_penalty)
    return out


def _word_splitter(language: str):
    if language == "en":
        return lambda text: text.lower().split()
    if language == "zh":
        try:
            import jieba
        except ImportError:
            raise ValueError("repetition_penalty: language='zh' segments words with jieba, which is not installed: "
                             "pip install jieba (or rlhf_ext[zh])") from None
        jieba.setLogLevel(60)  # its dictionary-loading chatter would go to every rollout's log
        return lambda text: list(jieba.cut(text))
    raise ValueError(f"repetition_penalty: language must be 'en' or 'zh', got {language!r}")


def _lengths(name: str, texts: List[str], completion_lengths, completion_ids) -> List[int]:
    if completion_lengths is not None:
        _check_lengths(name, texts, completion_lengths, "completion_lengths")
        return [int(n) for n in completion_lengths]
    if completion_ids is not None:
        _check_lengths(name, texts, completion_ids, "completion_ids")
        return [len(ids) for ids in completion_ids]
    return [len(t) for t in texts]


@register_reward("soft_overlong_punishment", per_sample=True)
def soft_overlong_punishment_reward(completions=None, *, max_completion_len: int = 16384,
                                    soft_punish_cache: int = 4096, completion_lengths=None, completion_ids=None,
                                    **kwargs) -> List[float]:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), as Open-R1.

    0 if L <= L_max - L_cache; (L_max - L_cache - L) / L_cache inside the buffer; -1 beyond L_max.
    Called as Open-R1 calls it, ``reward(completion_ids)`` or ``reward(completion_ids=...)`` (L in
    tokens), or with ``completions`` (text; L from ``completion_lengths``, ``completion_ids``, or
    characters).
    """
    for key, v in (("max_completion_len", max_completion_len), ("soft_punish_cache", soft_punish_cache)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"soft_overlong_punishment: {key} must be a non-negative integer, got {v!r}")
    if max_completion_len <= 0 or soft_punish_cache > max_completion_len:
        raise ValueError("soft_overlong_punishment: need 0 <= soft_punish_cache <= max_completion_len and "
                         f"max_completion_len > 0, got {soft_punish_cache} and {max_completion_len}")
    if completions is not None and completion_ids is None and _are_token_ids(completions):
        completions, completion_ids = None, completions  # Open-R1's positional form
    if completions is None:
        if completion_ids is None:
            raise ValueError("soft_overlong_punishment needs completion_ids (token ids) or completions")
        lengths = [len(ids) for ids in completion_ids]
    else:
        texts = completion_texts(completions)
        lengths = _lengths("soft_overlong_punishment", texts, completion_lengths, completion_ids)
    out = []
    for n in lengths:
        if n <= max_completion_len - soft_punish_cache:
            out.append(0.0)
        elif n <= max_completion_len:
            out.append((max_completion_len - soft_punish_cache - n) / soft_punish_cache)
        else:
            out.append(-1.0)
    return out


def _are_token_ids(items: Sequence) -> bool:
    """A batch of token-id lists (``[[1, 2], []]``), as opposed to texts or chat messages."""
    return len(items) > 0 and all(
        isinstance(x, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in items
    )


def _truncation_one(text, grade, truncated) -> float:
    return 1.0 if truncated else 0.0


@register_reward("truncation", per_sample=True, one=_truncation_one)
def truncation_reward(completions, *, truncated=None, **kwargs) -> List[float]:
    """1.0 for a completion cut off by the length limit (no end-of-sequence token), else 0.0.

    Weight it negatively (``truncation:-0.5``). ``truncated``: one bool per completion; without it
    nothing is known to be truncated.
    """
    texts = completion_texts(completions)
    if truncated is None:
        return [0.0] * len(texts)
    _check_lengths("truncation", texts, truncated, "truncated flags")
    return [_truncation_one(None, None, t) for t in truncated]


def _answer_format_one(text, grade, truncated) -> float:
    return 0.0 if find_answer_candidate(text) is None else 1.0


@register_reward("answer_format", per_sample=True, one=_answer_format_one)
def answer_format_reward(completions, **kwargs) -> List[float]:
    """1.0 when the completion states a final answer the grader can find (``\\boxed{}``, ``<answer>``
    tags, "The answer is ...", ``#### ...``), else 0.0: the format bonus of the plain GSM8K/MATH recipe."""
    return [_answer_format_one(t, None, None) for t in completion_texts(completions)]

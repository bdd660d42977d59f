"""Which final answers are the same answer, for maj@n: the grader's own equivalence, cached.

Self-consistency (Wang et al. 2022, arXiv 2203.11171) votes over *answers*, not spellings: the
``extracted`` vote keys already merge exact spellings (``0.5`` / ``\\frac{1}{2}`` / ``1/2``), but
``\\frac{\\sqrt{3}}{2}``, ``\\frac{\\sqrt3}{2}`` and ``\\frac{1}{2}\\sqrt{3}``, or ``5`` and ``5 cm``,
keep different keys and would split their votes, letting a wrong answer win. Two keys are the
same answer here when the grader says so: the second answer, graded against the first as if it
were the gold (:class:`~rlhf_ext.rewards.MathGrader`, so the same math-verify calls, worker
processes and time limits as the grading itself; a comparison that times out counts as
different).

Each key is compared by its answer as written (``find_answer_candidate`` on the response; the
normalized key is not LaTeX any more), the first such spelling in string order, so the result does
not depend on sample order. Two keys that are both plain integers are different answers without
asking math-verify. Only the :data:`MAX_CLUSTERED_KEYS` most-voted keys of a problem are compared
(a bound on the pairs, at most 496 per problem); rarer keys vote alone. Verdicts are cached per
(answer, answer) pair.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

from .metrics import vote_order

MAX_CLUSTERED_KEYS = 32
_INTEGER_KEY = re.compile(r"^-?\d+$")


def answer_as_written(record: dict) -> Optional[str]:
    """The final answer of a sample record as the model wrote it (for math-verify), or None.

    Falls back to the record's ``extracted`` key when the response is missing or its answer no longer
    normalizes to that key (a record written by another version of the extraction rules).
    """
    from rlhf_ext.rewards.extraction import find_answer_candidate, normalize_answer

    key = record.get("extracted")
    if key is None:
        return None
    response = record.get("response")
    if isinstance(response, str):
        for require_anchor in (True, False):  # the key may come from the fallback without an anchor
            candidate = find_answer_candidate(response, require_anchor=require_anchor)
            if candidate is not None and (normalize_answer(candidate.raw) or None) == key:
                return candidate.raw
    return str(key)


class AnswerEquivalence:
    """``same(a, b)``: is answer ``b`` correct if ``a`` were the gold? Batched through a MathGrader, cached.

    ``grader``: a :class:`~rlhf_ext.rewards.MathGrader`; None uses the process-wide default grader
    (started on first use). Call :meth:`prepare` with every problem's answers first so the
    comparisons run as one parallel batch; :meth:`same` computes a missing pair on the spot.
    """

    def __init__(self, grader=None, max_keys: int = MAX_CLUSTERED_KEYS):
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self._grader = grader
        self.max_keys = max_keys
        self._verdicts: Dict[Tuple[str, str], bool] = {}
        self.comparisons = 0  # math-verify comparisons actually run (cache misses)

    @property
    def grader(self):
        if self._grader is None:
            from rlhf_ext.rewards import default_grader

            self._grader = default_grader()
        return self._grader

    @staticmethod
    def _decided(a: str, b: str) -> Optional[bool]:
        if a == b:
            return True
        if _INTEGER_KEY.match(a) and _INTEGER_KEY.match(b):
            return int(a) == int(b)
        return None

    def pairs_for(self, keys: Sequence[Tuple[Hashable, str]], counts: Dict[Hashable, int]) -> List[Tuple[str, str]]:
        """The (gold-side, answer-side) raw pairs that clustering ``keys`` may ask about."""
        raw = dict(keys)
        top = vote_order(counts)[: self.max_keys]
        return [(raw[a], raw[b]) for i, a in enumerate(top) for b in top[i + 1:]]

    def prepare(self, pairs: Iterable[Tuple[str, str]]) -> None:
        """Run every comparison not yet known, as one batch across the grader's workers."""
        todo = []
        seen = set()
        for a, b in pairs:
            if (a, b) in self._verdicts or (a, b) in seen:
                continue
            decided = self._decided(a, b)
            if decided is not None:
                self._verdicts[(a, b)] = decided
                continue
            seen.add((a, b))
            todo.append((a, b))
        if not todo:
            return
        results = self.grader.grade_batch(["\\boxed{" + b + "}" for _, b in todo], [a for a, _ in todo])
        self.comparisons += len(todo)
        for (a, b), result in zip(todo, results):
            self._verdicts[(a, b)] = bool(result.correct)

    def same(self, a: str, b: str) -> bool:
        if (a, b) not in self._verdicts:
            self.prepare([(a, b)])
        return self._verdicts[(a, b)]

    def for_problem(self, keys: Sequence[Tuple[Hashable, str]], counts: Dict[Hashable, int]
                    ) -> Callable[[Hashable, Hashable], bool]:
        """``same(key_a, key_b)`` for one problem's vote keys (``keys``: (key, answer as written));
        keys outside the problem's :attr:`max_keys` most-voted are never the same as another key."""
        raw = dict(keys)
        top = set(vote_order(counts)[: self.max_keys])

        def same(a: Hashable, b: Hashable) -> bool:
            if a == b:
                return True
            if a not in top or b not in top:
                return False
            return self.same(raw[a], raw[b])

        return same


def problem_answers(records: Sequence[dict]) -> Tuple[List[Tuple[Hashable, str]], Dict[Hashable, int]]:
    """One problem's ``[(vote key, answer as written)]`` (one spelling per key: the first in string
    order) and the vote count of each key; abstentions (no answer) are left out."""
    spellings: Dict[Hashable, str] = {}
    counts: Counter = Counter()
    for rec in records:
        key = rec.get("extracted")
        if key is None:
            continue
        counts[key] += 1
        raw = answer_as_written(rec)
        if key not in spellings or raw < spellings[key]:
            spellings[key] = raw
    return sorted(spellings.items(), key=lambda kv: str(kv[0])), dict(counts)

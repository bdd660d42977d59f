"""``data pairs``: DPO preference pairs from graded samples.

Rules, per prompt (each pair records the rule that made it):

* ``mixed`` -- some answers right, some wrong: (correct, wrong) pairs, at most
  ``max_per_prompt``, drawn from all combinations with a seed derived from ``seed`` and the
  prompt id (the same pairs on every run, whatever the order of the prompts). Truncated answers
  are never chosen.
* ``brevity`` -- every answer right: the two shortest correct answers (in tokens) as chosen against
  the two longest as rejected, a 2x2 that teaches brevity without touching correctness; only
  pairs whose chosen answer is strictly shorter are kept.
* all answers wrong: no pair (nothing to prefer).

Answers with identical text count once. Output: ``prompt`` / ``chosen`` / ``rejected`` -- chat
messages by default (OpenRLHF ``--data.prompt_key prompt --data.apply_chat_template``; TRL's
conversational preference format) or plain text with the rendered prompt (``text=True``; TRL's
standard format, OpenRLHF without ``--data.apply_chat_template``).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections import Counter
from typing import List, Tuple

from .sample_dirs import PromptGroup, SampledRun, prompt_messages, response_tokens, unique_responses


def _rng(seed: int, prompt_id: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}\0{prompt_id}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def pairs_for_group(g: PromptGroup, *, max_per_prompt: int = 4, seed: int = 0,
                    brevity: bool = True) -> Tuple[str, List[Tuple[dict, dict]]]:
    """``(rule, [(chosen sample, rejected sample), ...])`` for one prompt; rule explains an empty list too."""
    if g.n == 0:
        return "not_sampled", []
    right = unique_responses([s for s in g.samples if s["correct"] and not s.get("truncated")])
    wrong = unique_responses([s for s in g.samples if not s["correct"]])
    if g.correct == 0:
        return "all_wrong", []
    if not right:
        return "no_complete_correct", []  # the only right answers were cut off
    if wrong:
        combos = list(itertools.product(right, wrong))
        _rng(seed, g.id).shuffle(combos)
        return "mixed", combos[:max_per_prompt]
    if not brevity:
        return "all_correct", []
    by_len = sorted(right, key=lambda s: (response_tokens(s), int(s["sample_index"])))
    short, long = by_len[:2], by_len[-2:][::-1]
    pairs = [(c, r) for c in short for r in long if c is not r and response_tokens(c) < response_tokens(r)]
    return ("brevity", pairs) if pairs else ("all_correct_same_length", [])


def build_pairs(run: SampledRun, *, max_per_prompt: int = 4, seed: int = 0, brevity: bool = True,
                text: bool = False) -> Tuple[List[dict], Counter, Counter]:
    """All pairs of the run as output rows; counts of pairs per rule and of prompts per outcome."""
    if max_per_prompt < 1:
        raise ValueError(f"--max-pairs-per-prompt must be >= 1, got {max_per_prompt}")
    rows: List[dict] = []
    pair_counts: Counter = Counter()
    prompt_counts: Counter = Counter()
    for g in run.groups:
        rule, pairs = pairs_for_group(g, max_per_prompt=max_per_prompt, seed=seed, brevity=brevity)
        prompt_counts[rule] += 1
        if not pairs:
            continue
        prompt = g.prompt if text else prompt_messages(run, g)
        for chosen, rejected in pairs:
            pair_counts[rule] += 1
            row = {"prompt": prompt}
            if text:
                row.update(chosen=chosen["response"], rejected=rejected["response"])
            else:
                row.update(chosen=[{"role": "assistant", "content": chosen["response"]}],
                           rejected=[{"role": "assistant", "content": rejected["response"]}])
            row.update(id=g.id, rule=rule, pass_rate=round(g.pass_rate, 6), chosen_tokens=response_tokens(chosen),
                       rejected_tokens=response_tokens(rejected))
            rows.append(row)
    return rows, pair_counts, prompt_counts

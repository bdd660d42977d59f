"""``data sft``: a rejection-sampling SFT set -- the correct answers of the kept prompts.

Rejection-sampling fine-tuning (RFT; Yuan et al. 2023, arXiv 2308.01825; Llama 2/3 "rejection
sampling"): keep only the sampled answers the grader accepts, deduplicated, optionally at most
``max_per_prompt`` per prompt (shortest first, which also favours concise reasoning). Truncated
answers are never kept. Output is OpenRLHF's SFT format: chat messages (``--data.input_key
messages --data.apply_chat_template``) by default, or plain text with the rendered prompt
(``--data.input_key prompt --data.output_key response``).
"""

from __future__ import annotations

from collections import Counter
from typing import List, Optional, Tuple

from .ranges import AccRange
from .sample_dirs import SampledRun, prompt_messages, response_tokens, unique_responses


def build_sft(run: SampledRun, keep: AccRange, *, max_per_prompt: Optional[int] = None,
              text: bool = False) -> Tuple[List[dict], Counter]:
    if max_per_prompt is not None and max_per_prompt < 1:
        raise ValueError(f"--max-per-prompt must be >= 1, got {max_per_prompt}")
    rows: List[dict] = []
    counts: Counter = Counter()
    for g in run.groups:
        if g.n == 0:
            counts["prompts_not_sampled"] += 1
            continue
        if g.pass_rate not in keep:
            counts["prompts_dropped_acc"] += 1
            continue
        right = unique_responses([s for s in g.samples if s["correct"] and not s.get("truncated")])
        if not right:
            counts["prompts_without_correct"] += 1
            continue
        counts["prompts_kept"] += 1
        right.sort(key=lambda s: (response_tokens(s), int(s["sample_index"])))
        chosen = right if max_per_prompt is None else right[:max_per_prompt]
        counts["duplicates_or_capped"] += g.correct - len(chosen)
        for s in chosen:
            if text:
                row = {"prompt": g.prompt, "response": s["response"]}
            else:
                row = {"messages": prompt_messages(run, g) + [{"role": "assistant", "content": s["response"]}]}
            row.update(id=g.id, pass_rate=round(g.pass_rate, 6), response_tokens=response_tokens(s))
            rows.append(row)
            counts["examples"] += 1
    return rows, counts

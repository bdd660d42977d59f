"""Rollout rewards from rlhf_ext's reward file in shared batches instead of one thread hop per sample.

OpenRLHF 0.11.2's ``SingleTurnAgentExecutor.execute`` scores each finished sample with
``await self._fetch_rewards_via_func([query], [prompt], [label])``, which runs
``asyncio.to_thread(reward_func, ...)`` once per sample on the event loop's default executor
(min(32, CPUs + 4) threads). With rlhf_ext's reward file the grading happens in worker processes,
so every sample paid a thread hand-off, a scoring call and a round trip of its own; on a 2-core node
that cost more CPU than math-verify itself (docs/benchmarks.md, "The reward path OpenRLHF calls").

The patched method keeps OpenRLHF's contract (one result per query, each what
``reward_func([q], [p], [l])`` returns) but, when the executor's reward file IS rlhf_ext's, hands the
calls to a per-event-loop group commit: at most ``MAX_INFLIGHT`` batches run at once in executor
threads, through :func:`rlhf_ext.rewards.openrlhf_reward.reward_func_calls` (one grading batch,
rewards still per call); calls arriving meanwhile wait on the event loop (no thread) and form the
next batch, which starts the moment one finishes. No timer: a lone call starts at once. Any other
reward file, or an HTTP reward server, goes through OpenRLHF's own method untouched.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

# Batches in flight at once: two lets one batch's scoring (Python, in the caller) overlap the other's
# grading (in the workers); 1, 2 and 4 measured alike on 2 cores.
MAX_INFLIGHT = 2
MAX_BATCH = 1024
_ATTR = "_rlhf_ext_reward_batchers"


def _is_rlhf_ext_reward_file(executor) -> bool:
    cached = getattr(executor, "_rlhf_ext_own_reward_file", None)
    if cached is None:
        from rlhf_ext.rewards.reward_file import reward_file_path

        endpoints = getattr(executor, "reward_endpoints", None) or []
        first = endpoints[0] if endpoints else None
        try:
            cached = bool(first) and os.path.realpath(first) == os.path.realpath(reward_file_path())
        except (TypeError, ValueError, OSError):
            cached = False
        executor._rlhf_ext_own_reward_file = cached
    return cached


class RewardBatcher:
    """Group commit of concurrent reward calls on one event loop (used only from that loop)."""

    def __init__(self, score_calls, max_inflight: Optional[int] = None, max_batch: Optional[int] = None):
        self.score_calls = score_calls
        self.max_inflight = max_inflight or MAX_INFLIGHT
        self.max_batch = max_batch or MAX_BATCH
        self.pending: List[Tuple[tuple, asyncio.Future]] = []
        self.inflight = 0
        self.stats = {"calls": 0, "batches": 0}

    async def score(self, calls: List[tuple]) -> list:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in calls]
        self.pending.extend(zip(calls, futures))
        self.stats["calls"] += len(calls)
        self._start_batches(loop)
        if len(futures) == 1:  # OpenRLHF's one call per sample: no gather (a future and a callback more each)
            return [await futures[0]]
        return list(await asyncio.gather(*futures))

    def _start_batches(self, loop) -> None:
        while self.pending and self.inflight < self.max_inflight:
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch:]
            self.inflight += 1
            self.stats["batches"] += 1
            loop.create_task(self._run(batch))

    async def _run(self, batch) -> None:
        try:
            outs = await asyncio.to_thread(self.score_calls, [call for call, _ in batch])
            if len(outs) != len(batch):
                raise RuntimeError(f"reward batch returned {len(outs)} results for {len(batch)} calls")
            for (_, future), out in zip(batch, outs):
                if not future.done():
                    future.set_result(out)
        except BaseException as exc:  # every caller of this batch gets it (OpenRLHF logs and goes on)
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self.inflight -= 1
            self._start_batches(asyncio.get_running_loop())


def _batcher(executor) -> RewardBatcher:
    loop = asyncio.get_running_loop()
    batchers: Dict[int, Tuple[object, RewardBatcher]] = executor.__dict__.setdefault(_ATTR, {})
    entry = batchers.get(id(loop))
    if entry is None or entry[0] is not loop:
        from rlhf_ext.rewards.openrlhf_reward import reward_func_calls

        entry = (loop, RewardBatcher(reward_func_calls))
        batchers[id(loop)] = entry
    return entry[1]


def make_fetch_rewards_via_func(original, module=None):
    @functools.wraps(original)
    async def _fetch_rewards_via_func(self, queries_list, prompts_list, labels_list):
        if not _is_rlhf_ext_reward_file(self):
            return await original(self, queries_list, prompts_list, labels_list)
        # OpenRLHF scores each query as its own reward_func call (batch_size 1): so do we
        calls = [([q], [p], [lab]) for q, p, lab in zip(queries_list, prompts_list, labels_list)]
        return await _batcher(self).score(calls)

    return _fetch_rewards_via_func

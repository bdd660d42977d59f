"""The grading pool's records: :class:`GradeResult` (the verdict on one response) and ``_Task``
(one submitted sample, with the copies of it that are queued or in workers' pipes).

Plain data shared by the pool (:mod:`.grading_pool`), its scheduler (:mod:`.grading_scheduler`),
its dispatcher thread (:mod:`.grading_dispatcher`) and the worker handles (:mod:`.grading_worker_handle`).
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Optional


@dataclass(frozen=True)
class GradeResult:
    """The verdict on one response.

    ``correct``: math-verify says the final answer equals the gold.
    ``extracted``: the response's final answer, normalized (a majority-vote key); None if it states none.
    ``gold_parsed``: the gold yielded an answer math-verify could parse; when False the sample is
    scored wrong and should be reported, not trained on as if the model erred.
    ``timeout``: grading overran the time limit and was killed (scored wrong).
    ``error``: why grading failed, if it did (scored wrong).
    """

    correct: bool
    extracted: Optional[str]
    gold_parsed: bool
    timeout: bool = False
    error: Optional[str] = None

    def as_dict(self) -> dict:
        return asdict(self)


class _Task:
    """One submitted sample. It may have several live copies: at most one in the queue (``queued``)
    and one in the pipe of each worker in ``holders`` (a copy rescued from behind a slow sample runs
    on another worker while the original still waits). Whichever copy answers first resolves the
    future; a copy lost with its worker is requeued unless another live copy remains."""

    __slots__ = ("id", "response", "gold_text", "future", "started", "queued", "holders", "_payload")

    def __init__(self, task_id: int, response: str, gold_text: Optional[str], future: Future):
        self.id = task_id
        self.response = response
        self.gold_text = gold_text
        self.future = future
        self.started = False  # future set running (it stays so when requeued after a worker died)
        self.queued = False  # a copy is in the grader's queue
        # workers with a copy in their pipe (head or waiting): their _Worker handles, left untyped here
        # because .grading_worker_handle imports this module
        self.holders: list = []
        self._payload: Optional[bytes] = None

    @property
    def live(self) -> bool:
        """Some copy is queued or on a worker, so the future will be answered."""
        return self.queued or bool(self.holders)

    @property
    def payload(self) -> bytes:
        if self._payload is None:
            self._payload = json.dumps([self.id, self.response, self.gold_text]).encode()
        return self._payload

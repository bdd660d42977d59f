"""A verifier cascade: the rule grader first, an LLM verifier only on the answers the rules score wrong.

Rule graders are precise but miss right answers written in forms they do not read (arXiv 2505.22203
measures ~86% recall for verl's, Qwen-Math's and math-verify's graders on RL data, and proposes
this cascade: rules first, a model on the rejects). Here the model is any OpenAI-compatible
``/v1/chat/completions`` endpoint (a vLLM server, ``python -m vllm.entrypoints.openai.api_server``,
or a hosted API). It is asked only about a response the rules scored wrong and that has a final
answer, and it can only turn wrong into right: a verdict it gives is recorded beside the rule
verdict, never in its place.

Safety: the prompt holds the problem, the gold answer and the response's final answer as text
(truncated to a few thousand characters); nothing the policy or the verifier wrote is executed.
The reply is read strictly (:func:`parse_verdict`): its last line must be ``CORRECT`` or
``INCORRECT``; anything else is a failure.

Failures (a timeout, a refused connection, an HTTP error, a reply that is not the API's JSON, a
verdict that cannot be read) never raise: the rule verdict stands and the failure is counted by
kind in :class:`CascadeStats`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

MAX_FIELD_CHARS = 4000  # per prompt field: a runaway answer must not make the verifier's prompt huge
SYSTEM_PROMPT = (
    "You check answers to math problems. You are given a problem, its reference answer and a student's "
    "final answer. Decide whether the student's final answer is mathematically equivalent to the reference "
    "answer (the same value or set of values, possibly written in another form, notation or unit). "
    "Reply with one word on the last line: CORRECT or INCORRECT.")
STATUSES = ("correct", "wrong", "failed", "skipped")


@dataclass(frozen=True)
class VerifierSettings:
    """Where the verifier is served and how it is asked.

    ``url``: the server's base address (``http://host:8000`` or ``.../v1``); ``model``: the served
    model's name; ``timeout``: seconds per request; ``concurrency``: requests in flight;
    ``max_tokens``: of the verifier's reply (a reasoning verifier needs more); ``api_key_env``: the
    environment variable holding a bearer token, if the endpoint needs one (never recorded);
    ``vllm_choice``: constrain the reply to ``CORRECT``/``INCORRECT`` with vLLM's structured outputs
    (``structured_outputs: {"choice": [...]}``, vLLM servers only: other APIs refuse the field).
    """

    url: str
    model: str
    timeout: float = 30.0
    concurrency: int = 8
    max_tokens: int = 16
    api_key_env: str = "OPENAI_API_KEY"
    vllm_choice: bool = False

    def validate(self) -> "VerifierSettings":
        if not isinstance(self.url, str) or not re.match(r"^https?://[^\s/]+", self.url):
            raise ValueError(f"verifier url must be http(s)://host[:port][/v1], got {self.url!r}")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("the verifier needs a model name (--verifier-model NAME), the one its server serves")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise ValueError(f"verifier timeout must be a positive number of seconds, got {self.timeout!r}")
        for name in ("concurrency", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"verifier {name} must be a positive integer, got {value!r}")
        return self

    @property
    def endpoint(self) -> str:
        base = self.url.rstrip("/")
        if base.endswith("/chat/completions"):
            return base
        return base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions")

    def public(self) -> dict:
        """What a record may hold (no key)."""
        return {"url": self.url, "model": self.model, "timeout": self.timeout, "concurrency": self.concurrency,
                "max_tokens": self.max_tokens, "vllm_choice": self.vllm_choice}

    @classmethod
    def from_mapping(cls, spec) -> "VerifierSettings":
        if not isinstance(spec, dict):
            raise ValueError(f"verifier settings must be a JSON object with url and model, got {spec!r}")
        known = ("url", "model", "timeout", "concurrency", "max_tokens", "api_key_env", "vllm_choice")
        unknown = set(spec) - set(known)
        if unknown:
            raise ValueError(f"unknown verifier setting(s) {sorted(unknown)}; known: {', '.join(known)}")
        missing = [k for k in ("url", "model") if k not in spec]
        if missing:
            raise ValueError(f"verifier settings lack {' and '.join(missing)}: the server's address and the model "
                             "name it serves")
        return cls(**spec).validate()


@dataclass(frozen=True)
class VerifierVerdict:
    """One answer's verifier outcome: ``status`` is ``correct``/``wrong`` (the verifier's verdict),
    ``failed`` (``error`` says why: timeout, connection, http, malformed, unreadable) or ``skipped``
    (no final answer to show it)."""

    status: str
    error: Optional[str] = None
    seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reply: Optional[str] = None  # the reply's first 200 characters, for audits

    @property
    def verdict(self) -> Optional[bool]:
        return {"correct": True, "wrong": False}.get(self.status)

    @property
    def failure_kind(self) -> Optional[str]:
        return self.error.split(":", 1)[0] if self.status == "failed" and self.error else None

    def record(self, model: str) -> dict:
        return {"model": model, "status": self.status, "verdict": self.verdict, "error": self.error,
                "seconds": round(self.seconds, 4), "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "reply": self.reply}


@dataclass
class CascadeStats:
    """Counts of a cascade pass (or of many, added up): what it cost and what it changed."""

    rule_wrong: int = 0  # answers the rules scored wrong (the candidates)
    asked: int = 0
    overturned: int = 0  # the verifier said correct
    upheld: int = 0
    failed: int = 0
    skipped: int = 0  # no final answer: not asked
    failures: Dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the pass
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, verdict: VerifierVerdict) -> None:
        self.rule_wrong += 1
        if verdict.status == "skipped":
            self.skipped += 1
            return
        self.asked += 1
        self.prompt_tokens += verdict.prompt_tokens
        self.completion_tokens += verdict.completion_tokens
        if verdict.status == "correct":
            self.overturned += 1
        elif verdict.status == "wrong":
            self.upheld += 1
        else:
            self.failed += 1
            kind = verdict.failure_kind or "unknown"
            self.failures[kind] = self.failures.get(kind, 0) + 1

    def merge(self, other: "CascadeStats") -> None:
        for name in ("rule_wrong", "asked", "overturned", "upheld", "failed", "skipped", "seconds", "prompt_tokens",
                     "completion_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for kind, count in other.failures.items():
            self.failures[kind] = self.failures.get(kind, 0) + count

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(self.failures.items()))
        return (f"verifier: asked {self.asked} of {self.rule_wrong} rule-wrong answers ({self.skipped} without a "
                f"final answer), {self.overturned} judged correct, {self.upheld} wrong, {self.failed} failed"
                f"{f' ({fails}; the rule verdict stands)' if fails else ''}; {self.seconds:.2f} s, "
                f"{self.prompt_tokens + self.completion_tokens} tokens")


def _clip(text: str) -> str:
    text = str(text)
    return text if len(text) <= MAX_FIELD_CHARS else text[:MAX_FIELD_CHARS] + " [...]"


def verifier_messages(problem: Optional[str], gold: str, answer: str) -> List[dict]:
    """The chat messages of one question: the problem (when known), the gold, the final answer (text only)."""
    parts = []
    if problem:
        parts.append(f"Problem:\n{_clip(problem)}")
    parts.append(f"Reference answer: {_clip(gold)}")
    parts.append(f"Student's final answer: {_clip(answer)}")
    parts.append("Is the student's final answer equivalent to the reference answer? Answer CORRECT or INCORRECT.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


_THINK = re.compile(r"<think>.*?</think>", re.S)
_DECOR = re.compile(r"^(?:final\s+)?(?:verdict|answer|judg(?:e)?ment)\s*[:=-]\s*", re.I)


def parse_verdict(reply: str) -> Optional[bool]:
    """``True``/``False`` from a reply whose last non-empty line is CORRECT / INCORRECT (any case, with
    markdown, a ``Verdict:`` prefix, ``\\boxed{}`` or a full stop around it); ``None`` otherwise."""
    if not isinstance(reply, str):
        return None
    text = _THINK.sub("", reply)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    last = lines[-1].strip("*_`#> .!\"'")
    last = _DECOR.sub("", last)
    box = re.fullmatch(r"\\boxed\{\s*(?:\\text\{)?\s*([A-Za-z]+)\s*\}?\s*\}", last)
    word = (box.group(1) if box else last).strip("*_`. ").upper()
    return {"CORRECT": True, "INCORRECT": False}.get(word)


def ask_verifier(settings: VerifierSettings, problem: Optional[str], gold: str, answer: str) -> VerifierVerdict:
    """One question to the endpoint; never raises."""
    request_body = {"model": settings.model, "messages": verifier_messages(problem, gold, answer),
                    "temperature": 0.0, "max_tokens": settings.max_tokens}
    if settings.vllm_choice:
        request_body["structured_outputs"] = {"choice": ["CORRECT", "INCORRECT"]}
    body = json.dumps(request_body).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(settings.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(settings.endpoint, data=body, headers=headers, method="POST")
    t0 = time.monotonic()

    def failed(error: str, reply: Optional[str] = None) -> VerifierVerdict:
        return VerifierVerdict("failed", error=error[:300], seconds=time.monotonic() - t0, reply=reply)

    try:
        with urllib.request.urlopen(request, timeout=settings.timeout) as response:
            raw = response.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return failed(f"http: status {exc.code}")
    except (socket.timeout, TimeoutError) as exc:
        return failed(f"timeout: no answer within {settings.timeout:g} s ({exc})")
    except urllib.error.URLError as exc:
        kind = "timeout" if isinstance(exc.reason, (socket.timeout, TimeoutError)) else "connection"
        return failed(f"{kind}: {exc.reason}")
    except Exception as exc:  # a reset connection, a malformed status line...
        return failed(f"connection: {type(exc).__name__}: {exc}")
    try:
        payload = json.loads(raw)
        reply = payload["choices"][0]["message"]["content"]
        usage = payload.get("usage") or {}
    except Exception:
        return failed("malformed: not an OpenAI chat completion", raw[:200].decode("utf-8", "replace"))
    verdict = parse_verdict(reply)
    seconds = time.monotonic() - t0
    shown = reply[:200] if isinstance(reply, str) else repr(reply)[:200]
    tokens = dict(prompt_tokens=int(usage.get("prompt_tokens") or 0),
                  completion_tokens=int(usage.get("completion_tokens") or 0))
    if verdict is None:
        return VerifierVerdict("failed", error="unreadable: the reply's last line is not CORRECT or INCORRECT",
                               seconds=seconds, reply=shown, **tokens)
    return VerifierVerdict("correct" if verdict else "wrong", seconds=seconds, reply=shown, **tokens)


@dataclass(frozen=True)
class Candidate:
    """An answer the rules scored wrong: the problem (None when unknown), the gold, the final answer
    the rule grader read (None: nothing to show the verifier)."""

    problem: Optional[str]
    gold: str
    answer: Optional[str]


class VerifierCascade:
    """Asks the verifier about candidates, ``settings.concurrency`` at a time. Thread-safe, never raises."""

    def __init__(self, settings: VerifierSettings):
        self.settings = settings.validate()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._lock = threading.Lock()

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="rlhf-ext-verifier")
            return self._pool

    def verify(self, candidates: Sequence[Candidate]) -> Tuple[List[VerifierVerdict], CascadeStats]:
        """A verdict per candidate (same order) and the pass's counts."""
        t0 = time.monotonic()
        stats = CascadeStats()
        futures = {}
        for i, c in enumerate(candidates):
            if c.answer is None or not str(c.answer).strip():
                continue
            futures[i] = self._executor().submit(ask_verifier, self.settings, c.problem, str(c.gold), str(c.answer))
        out = []
        # the socket timeout bounds each request; this bounds a request stuck elsewhere (DNS, a slow drip)
        limit = self.settings.timeout * 2 + 5
        for i in range(len(candidates)):
            if i not in futures:
                out.append(VerifierVerdict("skipped"))
                continue
            try:
                out.append(futures[i].result(timeout=limit))
            except Exception as exc:
                out.append(VerifierVerdict("failed", error=f"timeout: {type(exc).__name__}", seconds=limit))
        for v in out:
            stats.add(v)
        stats.seconds = time.monotonic() - t0
        return out, stats

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None

    def __enter__(self) -> "VerifierCascade":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cascade_correct(rule_correct: bool, verifier: Optional[dict]) -> bool:
    """The cascade's verdict from a rule verdict and a recorded verifier outcome (:meth:`VerifierVerdict.record`)."""
    return bool(rule_correct) or bool(verifier and verifier.get("verdict") is True)


# Training rewards (opt-in, RLHF_EXT_REWARD_VERIFIER): per-sample logs, averaged per step by the host
VERIFIER_LOG_KEYS = ("verifier/asked", "verifier/overturned", "verifier/failed", "verifier/seconds")


def _is_math_gold(gold) -> bool:
    # choice/ranking golds are JSON objects, graded by label rules: no verifier for those
    return isinstance(gold, str) and bool(gold.strip()) and not gold.lstrip().startswith("{")


def verify_grades(cascade: VerifierCascade, grades: Sequence, golds: Sequence,
                  problems: Optional[Sequence[Optional[str]]] = None):
    """The cascade on a batch of rule verdicts (``GradeResult``): ``(grades, logs, stats)`` where a
    rule-wrong math answer the verifier judges correct becomes correct, ``logs`` holds
    :data:`VERIFIER_LOG_KEYS` per sample, and ``stats`` the batch's counts. Never raises: a failure
    leaves the rule verdict and is counted."""
    n = len(grades)
    logs = {key: [0.0] * n for key in VERIFIER_LOG_KEYS}
    idx = [i for i, g in enumerate(grades) if not g.correct and _is_math_gold(golds[i])]
    cands = [Candidate(problems[i] if problems is not None else None, golds[i], grades[i].extracted) for i in idx]
    verdicts, stats = cascade.verify(cands)
    out = list(grades)
    for i, v in zip(idx, verdicts):
        if v.status == "skipped":
            continue
        logs["verifier/asked"][i] = 1.0
        logs["verifier/seconds"][i] = v.seconds
        if v.status == "failed":
            logs["verifier/failed"][i] = 1.0
        elif v.verdict:
            logs["verifier/overturned"][i] = 1.0
            out[i] = dataclasses.replace(grades[i], correct=True)
    if idx:
        logger.info("rlhf_ext reward %s", stats.line())
    return out, logs, stats

"""OpenRLHF's rule-reward protocol, without importing OpenRLHF: decoded queries in, reward dict out.

OpenRLHF 0.11.2 (``openrlhf/utils/agent.py``, ``SingleTurnAgentExecutor``) decodes each
prompt+response with ``skip_special_tokens=False`` and calls ``reward_func([query], [prompt],
[label])`` once per sample from an ``asyncio.to_thread`` worker thread, or POSTs
``{"query", "prompts", "labels"}`` to a reward server. It expects ``{"rewards", "scores",
"extra_logs"}``; ``scores`` drives dynamic filtering. Two consequences shape this module:

* the response must be recovered from the query: strip the prompt, then trailing end-of-sequence
  and other special tokens; a response that does not end in an EOS token was cut off by the
  length limit (vLLM keeps the EOS token id in the output, so its text is in the decoded query);
* ``extra_logs`` must carry the same keys for every sample: OpenRLHF concatenates the per-sample
  dicts and later splits them by batch size, so a key missing from one sample breaks the step.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .composite import FLAG_NAMES, RewardBreakdown, WeightedReward
from .config import RewardConfig
from .verifier_cascade import VERIFIER_LOG_KEYS, CascadeStats, VerifierCascade, VerifierSettings, verify_grades

logger = logging.getLogger(__name__)

# End-of-sequence (and end-of-turn) strings of common chat models, as decoded with special tokens.
DEFAULT_EOS_TOKENS: Tuple[str, ...] = (
    "<|im_end|>",  # Qwen, ChatML
    "<|endoftext|>",  # Qwen base, GPT-2 style
    "</s>",  # Llama 2, Mistral
    "<|eot_id|>",  # Llama 3
    "<|end_of_text|>",  # Llama 3 base
    "<｜end▁of▁sentence｜>",  # DeepSeek
    "<|end|>",  # Phi-3
    "<end_of_turn>",  # Gemma
    "<eos>",  # Gemma
    "<|eos|>",
)
# Where an assistant turn starts, for queries whose prompt part does not decode back to the prompt.
_ASSISTANT_MARKERS = (
    "<|im_start|>assistant\n",
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "<｜Assistant｜>",
    "<start_of_turn>model\n",
    "[/INST]",
    "<|assistant|>\n",
)
# Added tokens that carry meaning for the rewards and must survive special-token stripping.
_KEEP_TOKENS = {"<think>", "</think>", "<answer>", "</answer>"}

ERROR_KEY = "reward_flag/error"
PROMPT_NOT_FOUND_KEY = "reward_flag/prompt_not_found"


@dataclass(frozen=True)
class RecoveredResponse:
    text: str
    truncated: bool  # no end-of-sequence token at the end
    prompt_found: bool  # the prompt was located in the query (else the split is a best guess)


def _locate_prompt_end(query: str, prompt: str) -> Optional[int]:
    if not prompt:
        return 0
    if query.startswith(prompt):
        return len(prompt)
    # Decoding may not reproduce the prompt exactly (normalized spaces, a prompt truncated on the
    # left to fit max_len): find its tail near where the prompt should end.
    tail = prompt[-64:]
    if not tail.strip():
        return None
    best = None
    limit = len(prompt) + 256
    pos = query.find(tail)
    while 0 <= pos <= limit:
        end = pos + len(tail)
        if best is None or abs(end - len(prompt)) < abs(best - len(prompt)):
            best = end
        pos = query.find(tail, pos + 1)
    return best


@functools.lru_cache(maxsize=64)
def _longest_first(tokens: Tuple[str, ...]) -> Tuple[str, ...]:
    # per call this sort was a fifth of the reward file's own time on a batch of short answers
    return tuple(sorted({t for t in tokens if t}, key=len, reverse=True))


def recover_response(query: str, prompt: str, eos_tokens: Sequence[str] = DEFAULT_EOS_TOKENS,
                     special_tokens: Sequence[str] = ()) -> RecoveredResponse:
    """The response part of a decoded ``query``: after ``prompt``, without trailing EOS/special tokens.

    ``truncated`` is True when the response does not end in one of ``eos_tokens``.
    ``special_tokens`` (e.g. a tokenizer's ``all_special_tokens``) are removed from the response.
    """
    end = _locate_prompt_end(query, prompt if isinstance(prompt, str) else "")
    prompt_found = end is not None
    if end is None:
        marker_end = -1
        for marker in _ASSISTANT_MARKERS:
            pos = query.rfind(marker)
            if pos >= 0:
                marker_end = max(marker_end, pos + len(marker))
        end = marker_end if marker_end >= 0 else 0
    text = query[end:]
    enders = _longest_first(tuple(eos_tokens))
    truncated = True
    while True:
        stripped = text.rstrip()
        if not stripped.endswith(enders):  # one C call settles the usual last round (nothing left to strip)
            break
        for token in enders:
            if stripped.endswith(token):
                text = stripped[: -len(token)]
                truncated = False
                break
    for token in special_tokens:
        if token and token not in _KEEP_TOKENS and token in text:
            text = text.replace(token, "")
    return RecoveredResponse(text, truncated, prompt_found)


class _TokenizerInfo:
    """EOS/special tokens and a token counter from a local tokenizer (``RLHF_EXT_REWARD_TOKENIZER``)."""

    def __init__(self, path: str):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        specials = [t for t in getattr(self.tokenizer, "all_special_tokens", []) if t]
        eos = self.tokenizer.eos_token
        self.eos_tokens = tuple(dict.fromkeys(([eos] if eos else []) + [t for t in DEFAULT_EOS_TOKENS if t in specials]))
        self.special_tokens = tuple(t for t in specials if t not in _KEEP_TOKENS)

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


class RewardScorer:
    """Scores OpenRLHF batches (queries, prompts, labels) with a :class:`WeightedReward`; thread-safe.

    :meth:`score` never raises: a failure scores the batch 0 with ``reward_flag/error`` set.
    """

    def __init__(self, config: Optional[RewardConfig] = None):
        self.config = (config or RewardConfig()).validate()
        self.reward = WeightedReward(self.config.reward, options=self.config.options, timeout=self.config.timeout,
                                     workers=self.config.workers)
        self._tokenizer: Optional[_TokenizerInfo] = None
        self._tokenizer_error: Optional[str] = None
        self._tokenizer_lock = threading.Lock()
        self.log_keys = ([f"reward/{name}" for name, _ in self.reward.weights]
                         + [f"reward_flag/{flag}" for flag in FLAG_NAMES] + [PROMPT_NOT_FOUND_KEY, ERROR_KEY])
        # each call's log keys, built once (OpenRLHF calls once per sample)
        self._component_keys = {name: f"reward/{name}" for name, _ in self.reward.weights}
        self._flag_keys = {flag: f"reward_flag/{flag}" for flag in FLAG_NAMES}
        self._last_error_log = 0.0
        # the opt-in verifier cascade: rule verdicts first, the verifier on the rule-wrong answers
        self.cascade = None
        self.verifier_stats = CascadeStats()
        if self.config.verifier is not None and self.reward.uses_correctness:
            self.cascade = VerifierCascade(VerifierSettings.from_mapping(dict(self.config.verifier)))
            self.log_keys += list(VERIFIER_LOG_KEYS)
        # One sample a call (OpenRLHF's pattern), scored by each reward's one-sample form: without a
        # verifier or a tokenizer to count tokens with, which the batch path handles.
        self._one_sample = self.cascade is None and not self.config.tokenizer and self.reward.scores_one
        self._eos = self.config.eos_tokens or DEFAULT_EOS_TOKENS

    def close(self) -> None:
        self.reward.close()
        if self.cascade is not None:
            self.cascade.close()

    def _verify(self, batches: Sequence[Dict], prompts: Sequence[Optional[Sequence[str]]]) -> List[Optional[Dict]]:
        """With the verifier on: grade the batches in one pass, run the cascade, put the verdicts in each
        batch (``grades``) and return each batch's verifier logs (None for a batch left to grade alone)."""
        logs: List[Optional[Dict]] = [None] * len(batches)
        if self.cascade is None:
            return logs
        texts, golds, problems, shares = [], [], [], []
        for i, b in enumerate(batches):
            if b.get("solution") is None or b.get("grades") is not None:
                continue
            shares.append((i, len(texts), len(texts) + len(b["completions"])))
            texts += list(b["completions"])
            golds += list(b["solution"])
            problems += list(prompts[i]) if prompts[i] is not None else [None] * len(b["completions"])
        if not texts:
            return logs
        grades = self.reward.grade(texts, golds)
        grades, all_logs, stats = verify_grades(self.cascade, grades, golds, problems)
        with self._tokenizer_lock:
            self.verifier_stats.merge(stats)
        for i, lo, hi in shares:
            batches[i]["grades"] = grades[lo:hi]
            logs[i] = {k: v[lo:hi] for k, v in all_logs.items()}
        return logs

    def _tokenizer_info(self) -> Optional[_TokenizerInfo]:
        if not self.config.tokenizer or self._tokenizer_error:
            return None
        if self._tokenizer is not None:  # loaded once: later calls need no lock
            return self._tokenizer
        with self._tokenizer_lock:
            if self._tokenizer is None and not self._tokenizer_error:
                try:
                    self._tokenizer = _TokenizerInfo(self.config.tokenizer)
                except Exception as exc:
                    self._tokenizer_error = f"{type(exc).__name__}: {exc}"
                    logger.error("rlhf_ext reward: cannot load tokenizer %r (%s); using default EOS tokens and "
                                 "character lengths", self.config.tokenizer, self._tokenizer_error)
            return self._tokenizer

    def recover(self, queries: Sequence[str], prompts: Sequence[str]) -> List[RecoveredResponse]:
        info = self._tokenizer_info()
        eos = self.config.eos_tokens or (info.eos_tokens if info else DEFAULT_EOS_TOKENS)
        specials = info.special_tokens if info else ()
        return [recover_response(q, p, eos, specials) for q, p in zip(queries, prompts)]

    def score(self, queries: Sequence[str], prompts: Optional[Sequence[str]] = None,
              labels: Optional[Sequence] = None) -> Dict:
        """``{"rewards": [...], "scores": [...], "extra_logs": {key: [...]}}`` as plain lists."""
        n = len(queries) if isinstance(queries, (list, tuple)) else 0
        try:
            if n == 1 and self._one_sample:
                queries, prompts, labels = check_batch(queries, prompts, labels)
                r = recover_response(queries[0], prompts[0], self._eos)
                return self._result([r], self.reward.score_one(r.text, labels[0], r.truncated))
            recovered, batch = self._prepare(queries, prompts, labels)
            verifier_logs = None
            if self.cascade is not None:
                verifier_logs = self._verify([batch], [_prompt_list(prompts, len(recovered))])[0]
            return self._result(recovered, self.reward(**batch), verifier_logs)
        except Exception as exc:  # inside a training job: score and report, never raise
            return self.failed(n, exc)

    def score_sample(self, query: str, prompt: str, label) -> Dict:
        """:meth:`score` of one sample, as plain floats: ``{"rewards": float, "scores": float,
        "extra_logs": {key: float}}``, each the one value of :meth:`score`'s lists, the keys in its order.
        OpenRLHF's per-sample call, without the lists a batch needs. Never raises."""
        try:
            if not self._one_sample or type(query) is not str or type(prompt) is not str:
                out = self.score([query], [prompt], [label])
                return {"rewards": out["rewards"][0], "scores": out["scores"][0],
                        "extra_logs": {key: values[0] for key, values in out["extra_logs"].items()}}
            r = recover_response(query, prompt, self._eos)
            reward, correct, components, flags, _ = self.reward.score_one_values(r.text, label, r.truncated)
            keys = self._component_keys
            logs = {keys[name]: value for name, value in components.items()}
            keys = self._flag_keys
            for flag, value in flags.items():
                logs[keys[flag]] = value
            logs[PROMPT_NOT_FOUND_KEY] = 0.0 if r.prompt_found else 1.0
            logs[ERROR_KEY] = 0.0
            return {"rewards": reward, "scores": reward if correct is None else correct, "extra_logs": logs}
        except Exception as exc:  # inside a training job: score and report, never raise
            out = self.failed(1, exc)
            return {"rewards": 0.0, "scores": 0.0, "extra_logs": {key: values[0] for key, values in out["extra_logs"].items()}}

    def score_responses(self, recovered: Sequence[RecoveredResponse], labels: Sequence) -> Dict:
        """:meth:`score` for responses already taken out of their queries (an agent's turn). Never raises."""
        n = len(recovered)
        try:
            recovered = list(recovered)
            check_batch([r.text for r in recovered], None, labels)
            batch = self._batch(recovered, list(labels))
            verifier_logs = self._verify([batch], [None])[0]
            return self._result(recovered, self.reward(**batch), verifier_logs)
        except Exception as exc:
            return self.failed(n, exc)

    def score_calls(self, calls: Sequence[Tuple[Sequence[str], Sequence[str], Sequence]]) -> List[Dict]:
        """Many :meth:`score` calls at once, ``calls`` = ``[(queries, prompts, labels), ...]``: one
        result per call, each what :meth:`score` returns for it, the calls scored together by
        :meth:`WeightedReward.score_many` (every call's samples graded in ONE batch; merged and split
        when every reward of the spec is per-sample, as ``math`` is). A malformed call is scored alone
        (0, reported) and never affects the others."""
        prepared, batches = [], []
        for call in calls:
            try:
                recovered, batch = self._prepare(*call)
            except Exception:
                prepared.append(None)
                continue
            prepared.append(recovered)
            batches.append(batch)
        verifier_logs: List[Optional[Dict]] = [None] * len(batches)
        try:
            verifier_logs = self._verify(batches, [_prompt_list(call[1], len(rec))
                                                   for call, rec in zip(calls, prepared) if rec is not None])
        except Exception as exc:  # grading them together failed: score_many grades each batch (and reports)
            logger.warning("rlhf_ext reward: the verifier cascade's grading failed (%s); rules only", exc)
        verifier_logs_iter = iter(verifier_logs)
        results = iter(self.reward.score_many(batches))
        outs = []
        for call, recovered in zip(calls, prepared):
            if recovered is None:
                outs.append(self.score(*call))
                continue
            result = next(results)
            vlogs = next(verifier_logs_iter)
            outs.append(self.failed(len(recovered), result) if isinstance(result, Exception)
                        else self._result(recovered, result, vlogs))
        return outs

    def _prepare(self, queries, prompts, labels) -> Tuple[List[RecoveredResponse], Dict]:
        """One call as :class:`WeightedReward` takes it; raises ``ValueError`` for a malformed call."""
        queries, prompts, labels = check_batch(queries, prompts, labels)
        recovered = self.recover(queries, prompts)
        return recovered, self._batch(recovered, labels)

    def _batch(self, recovered: List[RecoveredResponse], labels: List) -> Dict:
        info = self._tokenizer_info()
        lengths = [info.count(r.text) for r in recovered] if info else None
        return {"completions": [r.text for r in recovered], "solution": labels,
                "truncated": [r.truncated for r in recovered], "completion_lengths": lengths}

    def _result(self, recovered: List[RecoveredResponse], breakdown: RewardBreakdown,
                verifier_logs: Optional[Dict] = None) -> Dict:
        """A breakdown as OpenRLHF's reward dict: the same ``extra_logs`` keys for every sample."""
        keys = self._component_keys
        logs = {keys[name]: values for name, values in breakdown.components.items()}
        if self.cascade is not None:
            logs.update(verifier_logs or {key: [0.0] * len(recovered) for key in VERIFIER_LOG_KEYS})
        keys = self._flag_keys
        for flag, values in breakdown.flags.items():
            logs[keys[flag]] = values
        logs[PROMPT_NOT_FOUND_KEY] = [0.0 if r.prompt_found else 1.0 for r in recovered]
        logs[ERROR_KEY] = [0.0] * len(recovered)
        scores = breakdown.correct if breakdown.correct is not None else breakdown.rewards
        return {"rewards": breakdown.rewards, "scores": scores, "extra_logs": logs}

    def failed(self, n: int, exc: BaseException) -> Dict:
        """A batch of ``n`` that could not be scored: 0 everywhere, ``reward_flag/error`` set, logged."""
        now = time.monotonic()
        if now - self._last_error_log > 10:
            self._last_error_log = now
            logger.error("rlhf_ext reward: scoring a batch of %d failed, scored 0: %s: %s", n,
                         type(exc).__name__, exc, exc_info=exc)
        logs = {key: [0.0] * n for key in self.log_keys}
        logs[ERROR_KEY] = [1.0] * n
        return {"rewards": [0.0] * n, "scores": [0.0] * n, "extra_logs": logs}


def _prompt_list(prompts, n: int) -> Optional[List[str]]:
    """The prompts the verifier is shown as each sample's problem (None when not given)."""
    return list(prompts) if isinstance(prompts, (list, tuple)) and len(prompts) == n else None


def check_batch(queries, prompts, labels) -> Tuple[List[str], List[str], List]:
    """Validate one request: lists of equal length, string queries and prompts; ``ValueError`` says what is wrong."""
    if not isinstance(queries, (list, tuple)):
        raise ValueError(f"'query' must be a list of strings, got {type(queries).__name__}")
    n = len(queries)
    if prompts is None:
        prompts = [""] * n
    if labels is None:
        labels = [None] * n
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"'prompts' must be a list of strings, got {type(prompts).__name__}")
    if not isinstance(labels, (list, tuple)):
        raise ValueError(f"'labels' must be a list, got {type(labels).__name__}")
    if not (len(prompts) == n == len(labels)):
        raise ValueError(f"list lengths differ: {n} queries, {len(prompts)} prompts, {len(labels)} labels")
    for name, seq in (("query", queries), ("prompts", prompts)):
        for i, item in enumerate(seq):
            if not isinstance(item, str):
                raise ValueError(f"'{name}[{i}]' must be a string, got {type(item).__name__}")
    return list(queries), list(prompts), list(labels)


_env_scorer: Optional[RewardScorer] = None
_env_lock = threading.Lock()


def scorer_from_env() -> RewardScorer:
    """The process-wide scorer configured by ``RLHF_EXT_REWARD*`` (read once per process)."""
    global _env_scorer
    scorer = _env_scorer  # set once: OpenRLHF's threads read it without queueing on the lock
    if scorer is not None:
        return scorer
    with _env_lock:
        if _env_scorer is None:
            from .config import reward_config_from_env

            _env_scorer = RewardScorer(reward_config_from_env())
        return _env_scorer

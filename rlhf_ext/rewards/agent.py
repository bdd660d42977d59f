"""rlhf_ext's rewards as the reward of an OpenRLHF multi-turn agent's ``step``.

OpenRLHF 0.11.2's ``MultiTurnAgentExecutor`` (``openrlhf/utils/agent.py``) calls the agent file's
``AgentInstance.step(states)`` after every model turn with ``states`` = ``{"observation_text",
"action_text", "label", "sampling_params"}`` and reads back ``rewards`` (a tensor; it calls
``.item()`` and sums the turns), ``scores`` (the last turn's, for dynamic filtering),
``extra_logs`` (the last turn's, one value per key; every sample must return the same keys),
``environment_feedback`` and ``done``. One line in an agent file gives it the same rewards as
``--reward.remote_url rlhf_ext:SPEC``::

    from rlhf_ext.rewards import agent_reward
    reward = agent_reward("rlhf_ext:math")          # or "accuracy:1.0,format:0.2", a preset, ...

    async def step(self, states, **kwargs):
        out = await reward.acall(states)             # grades states["action_text"] against states["label"]
        return {**out, "environment_feedback": "...", "done": True}

``acall`` grades in a worker thread: ``step`` runs on the event loop that drives vLLM's generation
for every episode of the rollout actor, and a synchronous ``reward(states)`` there would stall them
all for as long as the grading takes (up to the grader's timeout). ``out`` is ``{"rewards": tensor, "scores": tensor, "extra_logs": {key: tensor}}`` (float32 scalars):
the weighted reward, the correctness (0/1; the weighted reward when the spec grades nothing) and
every component and flag under the names the reward file logs (``reward/accuracy``,
``reward_flag/truncated``, ...). A call never raises: a failure scores 0 with
``reward_flag/error`` = 1 and is logged. A malformed spec raises ``ValueError`` when the agent file
is imported, which the plugin's driver-side check of ``--train.agent_func_path`` reports before
the cluster starts.

The text graded is the latest model turn (``states["action_text"]``, trailing end-of-sequence and
special tokens removed); pass ``text=`` to grade something else (the whole transcript, a turn the
agent kept). vLLM's ``action_text`` does not say whether the turn ran out of tokens, so
``truncated`` is ``False`` unless the agent passes it (the ``math`` preset's truncation penalty
then applies).
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Mapping, Optional

from .config import RewardConfig
from .openrlhf_protocol import RecoveredResponse, RewardScorer, recover_response
from .reward_file import short_form_spec


class AgentReward:
    """A reward spec scored one agent turn at a time; see the module docstring."""

    def __init__(self, spec: str = "rlhf_ext:math", *, timeout: float = 5.0, workers: Optional[int] = None,
                 options: Optional[Mapping[str, Mapping]] = None):
        if not isinstance(spec, str):
            raise ValueError(f"agent_reward: the reward spec must be a string like 'rlhf_ext:math', got {spec!r}")
        # the bare "rlhf_ext" is the default reward, as in --reward.remote_url (RewardConfig's default)
        name = "math" if spec == "rlhf_ext" else (short_form_spec(spec) if spec.startswith("rlhf_ext") else spec.strip())
        if not name:
            raise ValueError(f"agent_reward({spec!r}): name a reward after 'rlhf_ext:', e.g. 'rlhf_ext:math'")
        try:
            config = RewardConfig(reward=name, timeout=timeout, workers=workers, options=dict(options or {}))
            self.scorer = RewardScorer(config)
        except ValueError as exc:
            raise ValueError(f"agent_reward({spec!r}): {exc}") from None
        self.spec = name

    def __repr__(self) -> str:
        return f"agent_reward({self.spec!r})"

    def score(self, text: str, label: Any, *, truncated: bool = False) -> Dict[str, Any]:
        """Plain numbers: ``{"rewards": float, "scores": float, "extra_logs": {key: float}}``. Never raises."""
        try:
            if not isinstance(text, str):
                raise ValueError(f"the text to grade must be a string, got {type(text).__name__}")
            clean = recover_response(text, "").text  # trailing EOS / special tokens, if the turn kept them
            out = self.scorer.score_responses([RecoveredResponse(clean, bool(truncated), True)], [label])
            return {"rewards": float(out["rewards"][0]), "scores": float(out["scores"][0]),
                    "extra_logs": {k: float(v[0]) for k, v in out["extra_logs"].items()}}
        except Exception as exc:  # inside a rollout: score and report, never raise (the scorer's own failure path)
            out = self.scorer.failed(1, exc)
            return {"rewards": 0.0, "scores": 0.0, "extra_logs": {k: v[0] for k, v in out["extra_logs"].items()}}

    def __call__(self, states: Optional[Mapping[str, Any]] = None, label: Any = None, *, text: Optional[str] = None,
                 truncated: bool = False) -> Dict[str, Any]:
        """The tensors OpenRLHF's executor reads from ``step``: ``rewards``, ``scores`` and ``extra_logs``.

        ``states``: the dict ``step`` received (its ``action_text`` and ``label`` are used unless
        ``text`` / ``label`` are given). Never raises.
        """
        import torch

        states = states if isinstance(states, Mapping) else {}
        if text is None:
            text = states.get("action_text")
        if label is None:
            label = states.get("label")
        out = self.score(text, label, truncated=truncated)
        return {"rewards": torch.tensor(out["rewards"], dtype=torch.float32),
                "scores": torch.tensor(out["scores"], dtype=torch.float32),
                "extra_logs": {k: torch.tensor(v, dtype=torch.float32) for k, v in out["extra_logs"].items()}}

    async def acall(self, states: Optional[Mapping[str, Any]] = None, label: Any = None, *,
                    text: Optional[str] = None, truncated: bool = False) -> Dict[str, Any]:
        """:meth:`__call__` in a worker thread, for ``async def step``: the rollout actor's event loop
        keeps generating the other episodes while this turn is graded. Never raises."""
        return await asyncio.to_thread(self.__call__, states, label, text=text, truncated=truncated)

    def close(self) -> None:
        self.scorer.close()


def agent_reward(spec: str = "rlhf_ext:math", **config) -> AgentReward:
    """``agent_reward("rlhf_ext:math")``: a callable for an agent's ``step`` (see the module docstring).

    ``spec``: ``rlhf_ext:<spec>`` as in ``--reward.remote_url`` (a preset such as ``math`` or a
    weighted list such as ``accuracy:1.0,format:0.2``; the ``rlhf_ext:`` prefix is optional).
    ``config``: ``timeout``, ``workers``, ``options`` of :class:`rlhf_ext.rewards.RewardConfig`.
    """
    return AgentReward(spec, **config)


__all__ = ["AgentReward", "agent_reward"]

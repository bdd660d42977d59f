"""Per-turn credit for OpenRLHF's multi-turn agents: each turn's reward and anchor state, and GiGPO.

OpenRLHF 0.11.2's ``MultiTurnAgentExecutor.execute`` (``openrlhf/utils/agent.py``) calls the agent's
``step`` once per turn and keeps only the sum of the turns' ``rewards`` (and each turn's token
range, ``action_ranges``). An estimator taking ``turns`` (:data:`rlhf_ext.algorithms.HOST_INPUTS`;
``--algo.advantage.estimator gigpo``) gets them through three seams:

* ``MultiTurnAgentExecutor.execute`` (rollout actors): each ``step`` call's reward and anchor state
  are recorded (a context variable per ``execute`` task, so the concurrent samples of one prompt do
  not mix) and returned with the response under :data:`TURNS_KEY`. The anchor is the agent's own
  ``anchor_state`` when its ``step`` returns one (any value; its ``repr`` is hashed), else the text
  the model saw before the turn (``states["observation_text"]``): two turns share an anchor when
  they were taken from the same context. Anchors travel as 56-bit hashes;
* ``SamplesGenerator._process_response_into_experience`` (generator): the turns go into the
  sample's ``info`` -- its turns' rewards and anchors (``[1, K]``) and, per response token, the
  turn it belongs to (``[1, T]``, from ``action_ranges``, 0 off the model's tokens) -- only when
  the run's estimator takes ``turns``; OpenRLHF pads and splits ``info`` tensors with the samples;
* ``RemoteExperienceMaker.compute_advantages_and_returns`` (:mod:`.advantages`): the keys are
  popped (they never reach the logged status) and the estimator's per-turn advantages go on each
  turn's tokens (:func:`assign_turn_advantages`).
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
from typing import List, Optional, Tuple

TURNS_KEY = "rlhf_ext_turns"
TURN_INDEX_KEY = "rlhf_ext/turn_index"
TURN_REWARD_KEY = "rlhf_ext/turn_reward"
TURN_ANCHOR_KEY = "rlhf_ext/turn_anchor"
INFO_KEYS = (TURN_INDEX_KEY, TURN_REWARD_KEY, TURN_ANCHOR_KEY)
WRAPPED_ATTR = "_rlhf_ext_records_turns"

_turns: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("rlhf_ext_agent_turns", default=None)


def anchor_hash(value) -> int:
    """A 56-bit hash of an anchor state (exact in int64 and float64 alike)."""
    text = value if isinstance(value, str) else repr(value)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=7).digest(), "big")


def _record_step(step):
    @functools.wraps(step)
    async def recorded(self, states, **kwargs):
        result = await step(self, states, **kwargs)
        turns = _turns.get()
        if turns is not None and isinstance(result, dict):
            reward = result.get("rewards", 0.0)
            reward = float(reward.item() if hasattr(reward, "item") else reward)
            anchor = result["anchor_state"] if "anchor_state" in result else states.get("observation_text", "")
            turns.append((reward, anchor_hash(anchor)))
        return result

    setattr(recorded, WRAPPED_ATTR, True)
    return recorded


def _instrument(executor) -> None:
    cls = getattr(executor, "agent_instance_cls", None)
    step = getattr(cls, "step", None) if cls is not None else None
    if step is not None and not getattr(step, WRAPPED_ATTR, False):
        cls.step = _record_step(step)


def make_execute(original, module=None):
    """``MultiTurnAgentExecutor.execute``: the response also carries its turns' (reward, anchor)."""

    @functools.wraps(original)
    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):
        _instrument(self)
        turns: List[Tuple[float, int]] = []
        token = _turns.set(turns)
        try:
            out = await original(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images)
        finally:
            _turns.reset(token)
        if isinstance(out, dict):
            out[TURNS_KEY] = turns
        return out

    return execute


def wants_turns(args) -> bool:
    """Whether the run's estimator takes ``turns`` (registered rlhf_ext estimators only)."""
    from .config import OPENRLHF_ESTIMATORS, setting

    name = None if args is None else setting(args, "algo.advantage.estimator", None)
    if name is None or name in OPENRLHF_ESTIMATORS:
        return False
    from rlhf_ext.algorithms import get_advantage, host_inputs

    try:
        return "turns" in host_inputs(get_advantage(name))
    except KeyError:
        return False


def turn_info(response, truncate_length: int):
    """The three ``info`` tensors of one response's turns, or None when it carries none."""
    import torch

    turns = response.get(TURNS_KEY) if isinstance(response, dict) else None
    if not turns:
        return None
    ranges = response["action_ranges"]
    if len(ranges) != len(turns):
        raise ValueError(f"the agent executor recorded {len(turns)} step() calls for {len(ranges)} turns")
    position = torch.zeros(len(response["observation_tokens"]), dtype=torch.long)
    for t, (start, end) in enumerate(ranges):
        position[start:end] = t + 1
    index = position[1:truncate_length]  # aligned with OpenRLHF's action_mask
    return {
        TURN_INDEX_KEY: index.unsqueeze(0),
        TURN_REWARD_KEY: torch.tensor([[r for r, _ in turns]], dtype=torch.float32),
        TURN_ANCHOR_KEY: torch.tensor([[a for _, a in turns]], dtype=torch.long),
    }


def make_process_response_into_experience(original, module=None):
    """``SamplesGenerator._process_response_into_experience``: the turns into ``info`` when asked for."""

    @functools.wraps(original)
    def _process_response_into_experience(self, response, **generate_kwargs):
        experience = original(self, response, **generate_kwargs)
        if wants_turns(getattr(self, "args", None)):
            info = turn_info(response, generate_kwargs.get("max_len", 2048))
            if info is None:
                raise ValueError(f"--algo.advantage.estimator {self.args.algo.advantage.estimator} needs each "
                                 "trajectory's turns, and this response has none: run it with a multi-turn agent "
                                 "(--train.agent_func_path with a MultiTurnAgentExecutor)")
            experience.info.update(info)
        return experience

    return _process_response_into_experience


def pop_turns(experiences):
    """``[(index [B, T], rewards [B, K], anchors [B, K])]`` per experience, removed from ``info``."""
    out = []
    for e in experiences:
        if any(k not in e.info for k in INFO_KEYS):
            raise ValueError("this estimator needs each trajectory's turns, and the rollouts carry none: run it with a "
                             "multi-turn agent (--train.agent_func_path with a MultiTurnAgentExecutor)")
        out.append(tuple(e.info.pop(k) for k in INFO_KEYS))
    return out


def grouped_turns(turn_data, indices, n: int):
    """The ``turns=`` input ``[P][N]`` of ``(reward, anchor)`` lists, in the prompt order of ``indices``."""
    flat = []
    for index, rewards, anchors in turn_data:
        for row in range(index.shape[0]):
            k = int(index[row].max())
            flat.append([(float(rewards[row, t]), int(anchors[row, t])) for t in range(k)])
    ordered = [None] * len(flat)
    for position, i in enumerate(indices.tolist()):
        ordered[i] = flat[position]
    return [ordered[p * n:(p + 1) * n] for p in range(len(ordered) // n)]


TURNS_MEAN_KEY = "gigpo/turns_mean"
SHARED_KEY = "gigpo/shared_anchor_frac"


def attach_turn_metrics(experiences, turns) -> None:
    """The step's mean number of turns per trajectory and the fraction of turns whose anchor state another
    trajectory of the same prompt also visited, as per-sample ``info`` (every sample the same value)."""
    import torch

    n_turns = n_shared = n_traj = 0
    for row in turns:
        visitors = {}
        for n, trajectory in enumerate(row):
            for _, anchor in trajectory:
                visitors.setdefault(anchor, set()).add(n)
        for trajectory in row:
            n_traj += 1
            n_turns += len(trajectory)
            n_shared += sum(len(visitors[a]) > 1 for _, a in trajectory)
    values = {TURNS_MEAN_KEY: n_turns / max(n_traj, 1), SHARED_KEY: n_shared / max(n_turns, 1)}
    for e in experiences:
        rows = e.action_mask.shape[0]
        for key, value in values.items():
            e.info[key] = torch.full((rows,), float(value), dtype=torch.float32)


def assign_turn_advantages(advantages, turn_data, indices, exp_len):
    """Per-token advantages ``[B, T]`` per experience from the estimator's ``[P, N, K]`` output: each
    model token gets its turn's advantage (0 off the model's tokens)."""
    import torch

    flat = advantages.reshape(-1, advantages.shape[-1])[indices].split(exp_len)
    out = []
    for (index, _, _), per_turn in zip(turn_data, flat):
        padded = torch.cat([per_turn.new_zeros(per_turn.shape[0], 1), per_turn], dim=1)  # turn 0: no turn
        out.append(torch.gather(padded, 1, index.clamp(max=padded.shape[1] - 1)))
    return out

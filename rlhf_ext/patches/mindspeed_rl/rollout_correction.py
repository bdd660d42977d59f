"""Rollout/training mismatch correction on MindSpeed-RL 2.1.x: the engine's log-probs to the actor loss.

MindSpeed-RL's vLLM engine computes the sampled tokens' log-probs (``SamplingParams(logprobs=1)``)
and drops them on the way to the transfer dock. These seams carry them, as a ``rollout_log_probs``
column, from the engine to the actor loss, where :mod:`.losses` applies
:func:`rlhf_ext.algorithms.rollout_correction` (docs/rollout_correction.md, "MindSpeed-RL 2.1.0"),
module paths under ``mindspeed_rl.``:

* ``models.rollout.vllm_engine.VLLMInferEngine._post_process_outputs`` (actor workers): keeps each
  output's log-probs, cut to its own length, on the engine;
* ``workers.actor_hybrid_worker.ActorHybridWorkerBase.collect_transfer_dock_data`` (actor workers):
  after the sync generate step, the ``rollout_log_probs`` column, one row per response, cut to the
  length MindSpeed-RL stores for the response;
* ``workers.actor_hybrid_worker.ActorHybridWorkerBase.dispatch_transfer_dock_data`` (actor workers):
  the ``actor_train`` stage asks the dock for the column too;
* ``trainer.utils.data_strategy.DataStrategy.build_grpo`` / ``build_dapo`` (``train`` task): the
  dock gets the column (``addition_columns``);
* ``config_cls.validate_config.validate_rl_args`` (``train`` task): config-time refusal of what would
  make the log-probs wrong (below).

``validate_rl_args`` is the only MindSpeed-RL function that sees ``rl_config`` and ``generate_config``
together; the CLIs call it in their ``train`` Ray task (``parse_training_config``), first thing,
before any worker, model or engine exists -- not in the driver before ``ray.init`` (the driver
builds only ``RLConfig``, whose checks, :func:`.config.check_rollout_correction`, do run there).

With no correction configured every seam passes straight through to MindSpeed-RL's code (the
engine's seam still notes the rows it already computed; nothing else changes).

**Which log-probs.** The engine builds ``LLM(...)`` without ``logprobs_mode``, so a vLLM V1
engine returns ``raw_logprobs``: the log-softmax of the raw logits, before temperature, top-k,
top-p and min-p, while the trainer divides its logits by the sampling temperature
(``base_training_engine``: ``output.div_(self.temperature)``), and one token's raw log-prob cannot
be rescaled to another temperature (the normaliser needs every logit). MindSpeed-RL 2.1.0 pins no
vLLM, so passing ``logprobs_mode="processed_logprobs"`` (which an older vLLM rejects, and which
under top-k / top-p gives the truncated distribution's log-probs, see docs) is not done. Instead
:func:`check_sampling` requires the sampling settings under which raw log-probs, processed ones and
the trainer's full-vocabulary ``log_softmax`` are the same distribution: ``temperature 1``,
``top_k`` -1 (or 0), ``top_p 1``, ``min_p 0``, with ``logprobs`` not null, values read as the
engine reads them (``sampling_config.get(key, default)`` with the engine's defaults
``temperature 0.2``, ``top_k 50``: a config that omits them is refused).

**Rows.** MindSpeed-RL stores ``remove_padding_and_split_to_list(responses, eod, pad)``: each
response is the engine's row cut at its first pad token, plus that token when ``pad == eod``.
The rollout row is cut to the same length; the one position it can lack (the end-of-sequence
token appended when ``pad == eod`` and generation ended on a stop string instead of sampling it)
is +inf, "no rollout log-prob": the loss treats it as agreement (weight 1, never rejected) and
reports its share as ``rollout_corr/no_rollout_log_prob_fraction``.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, List, Mapping, Optional

import torch

from .config import ConfigError, rollout_correction_of, settings_of

COLUMN = "rollout_log_probs"
STASH = "_rlhf_ext_rollout_log_probs"  # on the engine: the last generate call's rows, one per output
TRAIN_STAGE = "actor_train"
LOSS_STAGES = ("ray_grpo", "ray_dapo")  # the stages whose actor losses rlhf_ext patches (.losses)
NO_ROLLOUT_LOG_PROB = math.inf  # a response token the engine did not sample (see the module docstring)
# the engine's own defaults for keys missing from sampling_config (VLLMInferEngine.__init__)
ENGINE_DEFAULTS = {"logprobs": 1, "temperature": 0.2, "top_k": 50, "top_p": 1.0, "min_p": 0.0}


def correction_of(rl_config):
    """``(RolloutCorrection, bypass)`` configured in ``rl_config`` (a patched RLConfig), or ``(None, False)``."""
    return rollout_correction_of(settings_of(getattr(rl_config, "kl_penalty", None)))


# --- config time --------------------------------------------------------------------------------


def check_sampling(sampling_config: Optional[Mapping[str, Any]], stage: Optional[str]) -> None:
    """Refuse the settings under which the engine's log-probs are not the trainer's distribution."""
    cfg = dict(sampling_config or {})

    def get(key):
        return cfg.get(key, ENGINE_DEFAULTS[key])

    if stage is not None and stage not in LOSS_STAGES:
        raise ConfigError(
            f"rollout correction (rl_config.rollout_is / rollout_rs) with megatron_training.stage={stage}: rlhf_ext "
            f"applies it in the GRPO and DAPO actor losses only ({', '.join(LOSS_STAGES)})")
    if get("logprobs") is None:
        raise ConfigError(
            "rollout correction needs the engine's sampled-token log-probs, but generate_config.sampling_config.logprobs "
            "is null (vLLM then returns none); set it to 1 (MindSpeed-RL's default)")
    why = ("MindSpeed-RL 2.1.0's engine builds vLLM's LLM(...) without logprobs_mode, so vLLM returns raw_logprobs "
           "(log-softmax of the raw logits, before temperature, top-k, top-p and min-p), while the trainer scores "
           "with logits divided by the temperature over the full vocabulary; the two differ by more than the "
           "numerics the correction is for (docs/rollout_correction.md, 'MindSpeed-RL')")
    wanted = (("temperature", lambda v: float(v) == 1.0, "1.0"), ("top_k", lambda v: int(v) in (-1, 0), "-1"),
              ("top_p", lambda v: float(v) == 1.0, "1.0"), ("min_p", lambda v: float(v) == 0.0, "0.0"))
    for key, ok, fix in wanted:
        value = get(key)
        if value is None or not ok(value):
            given = "" if key in cfg else f" (not set: the engine's default {ENGINE_DEFAULTS[key]})"
            raise ConfigError(
                f"rollout correction with generate_config.sampling_config.{key}={value!r}{given}: {why}. "
                f"Set sampling_config.{key}: {fix}, or train without rl_config.rollout_is / rollout_rs")


def make_validate_rl_args(original, module=None):
    """``validate_rl_args``: the sampling checks first, then MindSpeed-RL's own."""

    @functools.wraps(original)
    def validate_rl_args(actor_config, ref_config, reward_config, rl_config, generate_config,
                         critic_config=None, vit_config=None):
        if correction_of(rl_config)[0] is not None:
            check_sampling(getattr(generate_config, "sampling_config", None), getattr(actor_config, "stage", None))
        return original(actor_config, ref_config, reward_config, rl_config, generate_config, critic_config, vit_config)

    return validate_rl_args


# --- the engine and the generate step -----------------------------------------------------------


def make_post_process_outputs(original, module=None):
    """Keep each output's log-probs at its own length on the engine (the padded tensor loses lengths)."""

    @functools.wraps(original)
    def _post_process_outputs(self, request_outputs):
        token_ids, logprobs = original(self, request_outputs)
        lengths = [len(out.token_ids) for req in request_outputs for out in req.outputs]
        complete = isinstance(logprobs, torch.Tensor) and logprobs.dim() == 2 and logprobs.shape[0] == len(lengths)
        setattr(self, STASH, [logprobs[i, :n].to(torch.float32) for i, n in enumerate(lengths)] if complete else None)
        return token_ids, logprobs

    return _post_process_outputs


def rollout_rows(responses: List[torch.Tensor], engine_rows: Optional[List[torch.Tensor]]) -> List[torch.Tensor]:
    """One rollout row per stored response, of the response's length (module docstring, "Rows")."""
    if engine_rows is None:
        raise RuntimeError(
            "rollout correction: the vLLM engine returned no log-probs for this generate step (sampling_config.logprobs "
            "null, or an output without them); the run cannot be corrected")
    if len(engine_rows) != len(responses):
        raise RuntimeError(f"rollout correction: the engine returned {len(engine_rows)} log-prob rows for "
                           f"{len(responses)} responses")
    rows = []
    for response, row in zip(responses, engine_rows):
        n = len(response)
        if row.numel() >= n:
            rows.append(row[:n].clone())
        else:
            rows.append(torch.cat([row, row.new_full((n - row.numel(),), NO_ROLLOUT_LOG_PROB)]))
    return rows


def _engine(worker):
    hybrid = getattr(worker, "actor_hybrid", None)
    return getattr(hybrid, "inference_actor", None) if hybrid is not None else getattr(worker, "inference_model", None)


def make_collect_transfer_dock_data(original, module=None):
    """After a generate step: the ``rollout_log_probs`` column beside ``responses`` (correction on)."""

    @functools.wraps(original)
    def collect_transfer_dock_data(self, output, index, use_vllm=False, is_generate=False, sync=False):
        if is_generate and isinstance(output, dict) and "responses" in output:
            engine = _engine(self)
            rows = getattr(engine, STASH, None)
            if engine is not None and hasattr(engine, STASH):
                setattr(engine, STASH, None)  # one generate step's rows go to one collect call
            if correction_of(getattr(self, "rl_config", None))[0] is not None:
                output = dict(output)
                output[COLUMN] = rollout_rows(list(output["responses"]), rows)
        return original(self, output, index, use_vllm, is_generate, sync)

    return collect_transfer_dock_data


def make_dispatch_transfer_dock_data(original, module=None):
    """The actor's update asks the dock for ``rollout_log_probs`` too (its column list is a local variable)."""

    @functools.wraps(original)
    def dispatch_transfer_dock_data(self, experience_consumer_stage, experience_columns, *args, **kwargs):
        if (experience_consumer_stage == TRAIN_STAGE and COLUMN not in experience_columns
                and correction_of(getattr(self, "rl_config", None))[0] is not None):
            experience_columns = list(experience_columns) + [COLUMN]
        return original(self, experience_consumer_stage, experience_columns, *args, **kwargs)

    return dispatch_transfer_dock_data


def make_build_with_column(original, module=None):
    """``DataStrategy.build_grpo`` / ``build_dapo``: the dock has a ``rollout_log_probs`` column (correction on)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def build(self, *args, **kwargs):
        if correction_of(getattr(self, "rl_config", None))[0] is not None:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            columns = list(bound.arguments.get("addition_columns") or [])
            if COLUMN not in columns:
                bound.arguments["addition_columns"] = columns + [COLUMN]
            return original(*bound.args, **bound.kwargs)
        return original(self, *args, **kwargs)

    return build


# --- the actor loss ------------------------------------------------------------------------------


def rollout_log_probs_for(batch, train_log_probs: torch.Tensor, mask: torch.Tensor):
    """``(rollout log-probs with "none" replaced by the training value, share of such tokens)``."""
    rollout = batch.get(COLUMN) if hasattr(batch, "get") else None
    if rollout is None:
        raise ValueError(
            f"rollout correction: the actor batch has no {COLUMN!r} column; the run was configured for correction but "
            "the column did not reach the loss (an unpatched worker, or a generate path the correction does not support)")
    rollout = rollout.to(device=train_log_probs.device, dtype=train_log_probs.dtype)
    if rollout.shape != train_log_probs.shape:
        raise ValueError(f"rollout correction: {COLUMN} has shape {tuple(rollout.shape)}, the actor's log-probs "
                         f"{tuple(train_log_probs.shape)}")
    missing = mask & (rollout == NO_ROLLOUT_LOG_PROB)
    rollout = torch.where(missing, train_log_probs.detach(), rollout)
    share = missing.sum().to(train_log_probs.dtype) / mask.sum().clamp(min=1).to(train_log_probs.dtype)
    return rollout, share

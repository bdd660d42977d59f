"""``--train.async_enable``: how stale each step's rollouts are (``rlhf_ext/policy_lag``).

OpenRLHF 0.11.2's async trainer (``openrlhf/trainer/ppo_trainer_async.py``, ``PPOTrainerAsync``)
runs two Ray actors: ``GenerateSamplesActor`` fills a queue of ``--train.async_queue_size``
rollout batches while ``TrainingActor`` trains on the oldest one. A ``VLLMLock`` actor keeps
generation and the weight broadcast apart, so every batch is generated with one set of weights
(except with ``--train.partial_rollout_enable``, which pauses generation for the broadcast instead).

A policy *version* here is the number of training steps in the weights: the trainer's weights
at ``train_step(rollout_samples, global_step)`` are version ``global_step``; after that step's
broadcast vLLM holds version ``global_step + 1``. The lag of a sample is the trainer's version
when it trains on it minus the version vLLM held when it generated it.

Three seams carry the versions (all inert unless ``--train.async_enable``):

* ``BasePPOTrainer.broadcast_to_vllm`` (trainer actor): after the weights reached vLLM, publish
  the new version. ``TrainingActor.broadcast_to_vllm`` holds the ``VLLMLock`` around this call,
  so a generation can never start between the broadcast and the publication. The generator runs
  in another process (possibly on another node), so the version goes to Ray's GCS key-value
  store under this job's id (:func:`publish`);
* ``SamplesGenerator.generate_samples`` (generator actor, called inside the same lock): read
  the published version before generating and stamp it on every ``Experience`` this call created
  (those it returns and those it keeps in its buffer when ``--rollout.vllm_generate_batch_size`` >
  ``--rollout.batch_size``). No version published yet means the run's starting weights. The stamp
  is a plain attribute, so it travels with the batch through the rollout queue;
* ``BasePPOTrainer.train_step`` (trainer actor): before training, read the stamps of the batch;
  after, add ``rlhf_ext/policy_lag`` (mean over the step's samples) and
  ``rlhf_ext/policy_lag_max`` to the step's status, hence the console line, wandb / TensorBoard
  and the run record's ``metrics.jsonl``.

In synchronous mode nothing is stamped and the metrics are absent: OpenRLHF's ``PPOTrainer.fit``
generates step N's batch after step N-1's broadcast, in the same process, so the lag is 0 by
construction. With ``--train.partial_rollout_enable`` a batch may see a broadcast mid-generation;
its stamp is the version at the start, so the lag is then an upper bound.

Rollout correction and mismatch metrics in async mode: ``Experience.rollout_log_probs`` is filled
once, in ``SamplesGenerator._process_response_into_experience``, from the log-probs vLLM returned
with the tokens (the stale, behaviour policy), and is never recomputed: the experience maker
computes ``action_log_probs`` with the trainer's current weights, the mismatch metrics
(:mod:`.mismatch`) compare those two, and the correction (:mod:`.rollout_correction`) weighs by
their ratio. In async mode both therefore include the policy lag, not only the numerical
mismatch (``tests/test_openrlhf_async_agents.py`` pins it).
"""

from __future__ import annotations

import functools
import itertools
import sys
from typing import Dict, Iterable, Optional

from ... import runs
from .config import setting

STAMP_ATTR = "_rlhf_ext_policy_version"
"""The attribute on each ``Experience``: the version that generated it (``None``: the run's starting weights)."""
NEXT_ATTR = "_rlhf_ext_next_policy_version"
START_ATTR = "_rlhf_ext_start_policy_version"
LAG_KEY = runs.POLICY_LAG
LAG_MAX_KEY = runs.POLICY_LAG_MAX
KV_NAMESPACE = "rlhf_ext"

_local_version: Optional[int] = None  # tests, and a process without Ray
_warned = False


def async_enabled(args) -> bool:
    return bool(setting(args, "train.async_enable", False))


def _kv_key() -> Optional[bytes]:
    try:
        import ray

        if not ray.is_initialized():
            return None
        return f"policy_version/{ray.get_runtime_context().get_job_id()}".encode()
    except Exception:  # noqa: BLE001 - no Ray here: the process-local value is the store
        return None


def publish(version: int) -> None:
    """The weights in vLLM are now ``version`` (trainer actor, after a broadcast)."""
    global _local_version
    _local_version = int(version)
    key = _kv_key()
    if key is not None:
        from ray.experimental.internal_kv import _internal_kv_put

        _internal_kv_put(key, str(int(version)).encode(), overwrite=True, namespace=KV_NAMESPACE)


def read() -> Optional[int]:
    """The version last published in this job (``None``: none yet, the run's starting weights)."""
    key = _kv_key()
    if key is None:
        return _local_version
    from ray.experimental.internal_kv import _internal_kv_get

    value = _internal_kv_get(key, namespace=KV_NAMESPACE)
    return None if value is None else int(value)


def lag_stats(trainer_version: int, versions: Iterable[Optional[int]], start_version: int) -> Dict[str, float]:
    """``{LAG_KEY: mean, LAG_MAX_KEY: max}`` of ``trainer_version - v`` over the samples' versions
    (``None`` = ``start_version``); empty when there is no sample."""
    lags = [int(trainer_version) - (int(start_version) if v is None else int(v)) for v in versions]
    if not lags:
        return {}
    return {LAG_KEY: sum(lags) / len(lags), LAG_MAX_KEY: float(max(lags))}


def stamp(experiences: Iterable, version: Optional[int]) -> int:
    """Stamp ``version`` on each experience that has no stamp yet; returns how many were stamped."""
    n = 0
    for exp in experiences:
        if not hasattr(exp, STAMP_ATTR):
            setattr(exp, STAMP_ATTR, version)
            n += 1
    return n


# --- seams --------------------------------------------------------------------------------------


def make_generate_samples(original, module=None):
    """``SamplesGenerator.generate_samples``: stamp the version vLLM generates with (async only)."""

    @functools.wraps(original)
    def generate_samples(self, **generate_kwargs):
        if not async_enabled(self.args):
            return original(self, **generate_kwargs)
        version = read()  # inside the VLLMLock: no broadcast can land during this call
        out = original(self, **generate_kwargs)
        stamp(itertools.chain(out[0] or [], getattr(self, "_sample_buffer", None) or []), version)
        return out

    return generate_samples


def make_broadcast_to_vllm(original, module=None):
    """``BasePPOTrainer.broadcast_to_vllm``: publish the version the broadcast put into vLLM."""

    @functools.wraps(original)
    def broadcast_to_vllm(self):
        out = original(self)
        version = getattr(self, NEXT_ATTR, None)
        if version is not None and async_enabled(self.args):
            publish(version)
        return out

    return broadcast_to_vllm


def make_train_step(original, module=None):
    """``BasePPOTrainer.train_step``: the step's policy lag, from the stamps on its rollouts."""

    @functools.wraps(original)
    def train_step(self, rollout_samples, global_step):
        global _warned
        if not async_enabled(self.args):
            return original(self, rollout_samples, global_step)
        start = self.__dict__.setdefault(START_ATTR, int(global_step))
        missing = object()
        versions = [getattr(exp, STAMP_ATTR, missing) for exp in rollout_samples or []]
        stats = {}
        if versions and all(v is not missing for v in versions):
            stats = lag_stats(int(global_step), versions, start)
            from . import staleness  # --rlhf_ext.prox_logp loglinear|linear interpolates by each sample's lag

            staleness.attach_lags(self.args, rollout_samples,
                                  [int(global_step) - (start if v is None else int(v)) for v in versions])
        elif versions and not _warned:
            _warned = True
            sys.stderr.write("rlhf_ext: warning: these async rollouts carry no policy version (was the generator "
                             f"actor started without the plugin?); {LAG_KEY} is not logged\n")
        self.__dict__[NEXT_ATTR] = int(global_step) + 1
        status, step = original(self, rollout_samples, global_step)
        if stats and isinstance(status, dict):
            status.update(stats)
        return status, step

    return train_step

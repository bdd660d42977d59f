"""``--rlhf_ext.sync_ref_model``: OpenRLHF's reference model follows the policy (TRL's ``sync_ref_model``).

OpenRLHF 0.11.2 keeps the reference model (``ReferenceModelActor``, created when
``--algo.kl.init_coef > 0``) frozen at the starting weights. With the flag, after every
``--rlhf_ext.ref_model_sync_steps`` training steps each reference parameter becomes
``alpha * theta + (1 - alpha) * theta_ref`` (``--rlhf_ext.ref_model_mixup_alpha``, TRL's defaults 0.6
and 512; :func:`rlhf_ext.algorithms.ref_sync.mix_into_reference`). Seams:

* ``BasePPOTrainer.train_step`` (PPOTrainer / TrainingActor): after the step (its PPO update and
  broadcast), when the new step count is a multiple of the period, ask the policy actors for their
  weights and hand rank 0's to every reference actor; the step's status gets ``rlhf_ext/ref_sync``
  (1 on a sync step), ``rlhf_ext/ref_sync_max_err`` (the largest distance of a reference parameter
  from the mix, in float64) and ``rlhf_ext/ref_sync_max_err_ulp`` (that distance in roundings of the
  parameter dtype, <= ~2 when the reference holds the mix);
* ``BaseModelActor.execute_batch`` (every model actor): OpenRLHF's generic "call a method by name"
  entry point, through which the two calls above reach the actors (Ray fixes an actor's remote
  methods when its class is decorated, so no new remote method can be added).

The weights travel through Ray's object store on the CPU once per period (the whole model). Refused at
start-up: ZeRO-3 (the actors hold parameter shards), LoRA (the policy's parameters are not the
reference's), ``--ds.enable_sleep`` (the reference's states are offloaded), no reference model
(``--algo.kl.init_coef 0``). With ``--ckpt.load_enable`` a warning says that the reference's synced weights
are not in OpenRLHF's checkpoint (it saves the policy and critic only): a resumed run's reference starts
again from the pretrained weights and follows the policy from there, as TRL's does.
"""

from __future__ import annotations

import functools
import math
from typing import Dict

from .config import setting

FLAG = "--rlhf_ext.sync_ref_model"
POLICY_WEIGHTS = "rlhf_ext_policy_weights"
MIX = "rlhf_ext_mix_reference"
SYNC_KEY = "rlhf_ext/ref_sync"
ERR_KEY = "rlhf_ext/ref_sync_max_err"
ULP_KEY = "rlhf_ext/ref_sync_max_err_ulp"  # the error in roundings of the parameter dtype (bf16 on a real run)
DEFAULT_ALPHA, DEFAULT_STEPS = 0.6, 512


def add_arguments(group) -> None:
    group.add_argument(FLAG, action="store_true", default=False,
                       help="the reference model follows the policy: every --rlhf_ext.ref_model_sync_steps steps "
                       "ref = alpha * policy + (1 - alpha) * ref (TRL's sync_ref_model, TR-DPO)")
    group.add_argument("--rlhf_ext.ref_model_mixup_alpha", type=float, default=None, metavar="ALPHA",
                       help=f"{FLAG}: the policy's share alpha in (0, 1] (default {DEFAULT_ALPHA})")
    group.add_argument("--rlhf_ext.ref_model_sync_steps", type=int, default=None, metavar="N",
                       help=f"{FLAG}: training steps between syncs (default {DEFAULT_STEPS})")


def settings(args):
    """``(alpha, sync_steps)`` or None when the flag is off."""
    if not setting(args, "rlhf_ext.sync_ref_model", False):
        return None
    return (float(setting(args, "rlhf_ext.ref_model_mixup_alpha", DEFAULT_ALPHA)),
            int(setting(args, "rlhf_ext.ref_model_sync_steps", DEFAULT_STEPS)))


def finalize(namespace) -> None:
    def get(dotted, default=None):
        value = getattr(namespace, dotted, None)
        return default if value is None else value

    if not get("rlhf_ext.sync_ref_model", False):
        given = [k for k in ("rlhf_ext.ref_model_mixup_alpha", "rlhf_ext.ref_model_sync_steps") if get(k) is not None]
        if given:
            raise ValueError(f"--{given[0]} sets the reference model's sync: add {FLAG}")
        return
    alpha = float(get("rlhf_ext.ref_model_mixup_alpha", DEFAULT_ALPHA))
    steps = int(get("rlhf_ext.ref_model_sync_steps", DEFAULT_STEPS))
    if not (math.isfinite(alpha) and 0 < alpha <= 1):
        raise ValueError(f"--rlhf_ext.ref_model_mixup_alpha must be in (0, 1], got {alpha}")
    if steps < 1:
        raise ValueError(f"--rlhf_ext.ref_model_sync_steps must be >= 1, got {steps}")
    if not float(get("algo.kl.init_coef", 0.01)) > 0:
        raise ValueError(f"{FLAG}: OpenRLHF creates the reference model only with --algo.kl.init_coef > 0; there is "
                         "no reference to sync")
    if int(get("ds.zero_stage", 2)) >= 3:
        raise ValueError(f"{FLAG} with --ds.zero_stage 3: the actors hold parameter shards, and rlhf_ext syncs whole "
                         "parameters; use ZeRO stage 0-2")
    if get("ds.enable_sleep", False):
        raise ValueError(f"{FLAG} with --ds.enable_sleep: the reference's weights are offloaded between uses; sync "
                         "without sleep mode")
    if int(get("ds.lora.rank", 0) or 0) > 0:
        raise ValueError(f"{FLAG} with LoRA (--ds.lora.rank): the policy's parameters (base + adapters) are not the "
                         "reference's")
    if get("ckpt.load_enable", False):
        import warnings

        warnings.warn(f"{FLAG} with --ckpt.load_enable: the reference's synced weights are not in OpenRLHF's "
                      "checkpoint, so a resumed run's reference starts again from the pretrained weights and "
                      "follows the policy from there", UserWarning, stacklevel=2)


def _hf_module(model):
    """The Hugging Face module inside OpenRLHF's ``Actor`` (``model.model``, a DeepSpeed engine's ``module``)."""
    inner = getattr(model, "model", model)
    return getattr(inner, "module", inner)


def policy_weights(actor_model) -> Dict[str, object]:
    """The policy's parameters by name, on the CPU (what a reference actor mixes in)."""
    return {name: p.detach().to("cpu", copy=True) for name, p in _hf_module(actor_model).named_parameters()}


def mix_reference(ref_model, weights, alpha: float) -> Dict[str, float]:
    from rlhf_ext.algorithms.ref_sync import mix_into_reference

    return mix_into_reference(_hf_module(ref_model).named_parameters(), weights, alpha)


def make_execute_batch(original, module=None):
    """``BaseModelActor.execute_batch``: rlhf_ext's two calls by name; everything else as OpenRLHF does."""

    @functools.wraps(original)
    def execute_batch(self, method_name, all_data, start_idx, end_idx):
        if method_name == POLICY_WEIGHTS:
            return [policy_weights(self.actor)]
        if method_name == MIX:
            weights = all_data["weights"][0]
            if type(weights).__name__ == "ObjectRef":  # one copy in the object store for every reference rank
                import ray

                weights = ray.get(weights)
            return [mix_reference(self.model, weights, float(all_data["alpha"][0]))]
        return original(self, method_name, all_data, start_idx, end_idx)

    return execute_batch


def sync(trainer, alpha: float) -> Dict[str, float]:
    """Mix the policy (its rank 0's weights) into every reference actor; the status entries."""
    import ray

    # async_run_method(method_name, *args): execute_batch's own arguments go positionally
    weights = ray.get(trainer.actor_model_group.async_run_method(
        "execute_batch", POLICY_WEIGHTS, {"_": [0]}, 0, 1))[0][0]
    ref = ray.put(weights)
    results = ray.get(trainer.reference_model_group.async_run_method(
        "execute_batch", MIX, {"weights": [ref], "alpha": [alpha]}, 0, 1))
    return {SYNC_KEY: 1.0, ERR_KEY: max(r[0]["max_err"] for r in results),
            ULP_KEY: max(r[0]["max_err_ulp"] for r in results)}


def make_train_step(original, module=None):
    """``BasePPOTrainer.train_step``: after the step, the reference follows the policy when due."""

    @functools.wraps(original)
    def train_step(self, rollout_samples, global_step):
        chosen = settings(self.args)
        out = original(self, rollout_samples, global_step)
        if chosen is None or getattr(self, "reference_model_group", None) is None:
            return out
        from rlhf_ext.algorithms.ref_sync import sync_due

        status, step = out
        alpha, every = chosen
        entries = sync(self, alpha) if sync_due(int(step), every) else {SYNC_KEY: 0.0}
        if isinstance(status, dict):
            status.update(entries)
        return status, step

    return train_step

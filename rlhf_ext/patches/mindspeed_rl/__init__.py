"""The ``rlhf_ext`` plugin for MindSpeed-RL 2.1.x: which seams are patched, and activation.

Seams (each checked against the parameter list it was written for, see :mod:`.compat`; module
paths under ``mindspeed_rl.``):

====================================================  =========================================  ===================
where                                                 what                                       runs in
====================================================  =========================================  ===================
``config_cls.rl_config.RLConfig.__init__``            new keys, validation (:mod:`.config`)      every process
``trainer.utils.compute_utils.compute_advantage``     registered estimators (:mod:`.advantages`)  advantage task
``trainer.{grpo,dapo,ppo}_trainer_hybrid`` (name)     the same task where the trainers look it   trainer task
``utils.compute.compute_kl_penalty``                  k1/k2/k3, ``kl_clip`` (:mod:`.kl`)          actor, KL task
``trainer.utils.compute_utils.compute_kl_penalty``    the same, where PPO's KL-in-reward looks    KL task
``models.loss.grpo_actor_loss_func`` (3 seams)        policy loss, aggregation, KL (:mod:`.losses`)  actor workers
``models.loss.dapo_actor_loss_func`` (2 seams)        policy loss, aggregation (:mod:`.losses`)  actor workers
``models.rule_verifier.verifier``                     ``rlhf_ext:NAME`` rewards (:mod:`.rewards`)  rule-reward workers
``ray.init``                                          plugin env in the job's runtime env        driver
``config_cls.validate_config.validate_rl_args``       rollout correction's sampling rules        ``train`` task
``models.rollout.vllm_engine.VLLMInferEngine``        rollout log-probs kept per output          actor workers
``workers.actor_hybrid_worker`` (2 seams)             ``rollout_log_probs`` column in and out    actor workers
``trainer.utils.data_strategy.DataStrategy`` (2)      the column in the transfer dock            trainer task
``workers.actor_hybrid_worker...update``              adaptive entropy: the step's coefficient   actor workers
``models.actor.Actor.update_actor``                   adaptive entropy: the step's entropy       actor workers
====================================================  =========================================  ===================

The four before them carry the engine's log-probs to the actor losses for the rollout correction
(:mod:`.rollout_correction`; they pass through when it is not configured); the last two step the
entropy coefficient of ``rl_config.adaptive_entropy`` (:mod:`.entropy_control`; they pass through
without it).

MindSpeed-RL's ``cli/train_{grpo,dapo,ppo}.py`` is the driver: ``--plugin rlhf_ext`` is removed
from its argv before Hydra parses it (:mod:`rlhf_ext.patches.activation.startup`), and a bad ``rl_config``
value stops it with exit code 2 and a message naming the key and the valid values, before Ray
starts. Every other process (Ray workers: the ``train`` task, actor workers, rule rewards, the
advantage task) applies each patch when it imports the patched module
(:mod:`rlhf_ext.seams.import_hooks`), since Ray pickles classes and functions by reference.
"""

from __future__ import annotations

from ...seams import import_hooks
from . import compat
from .compat import (
    SUPPORTED_DESCRIPTION,
    MindSpeedRLCompatibilityError,
    Patch,
    Requirement,
    applied,
    check_version,
    mindspeed_rl_version,
    verify_all,
)
from .config import MINDSPEED_VERIFIERS, ConfigError, ConfiguredName

_HERE = __name__
PKG = "mindspeed_rl"
RL_CONFIG = PKG + ".config_cls.rl_config"
COMPUTE_UTILS = PKG + ".trainer.utils.compute_utils"
COMPUTE = PKG + ".utils.compute"
GRPO_LOSS = PKG + ".models.loss.grpo_actor_loss_func"
DAPO_LOSS = PKG + ".models.loss.dapo_actor_loss_func"
RULE_VERIFIER = PKG + ".models.rule_verifier"
VALIDATE_CONFIG = PKG + ".config_cls.validate_config"
VLLM_ENGINE = PKG + ".models.rollout.vllm_engine"
ACTOR_WORKER = PKG + ".workers.actor_hybrid_worker"
DATA_STRATEGY = PKG + ".trainer.utils.data_strategy"
ACTOR = PKG + ".models.actor"
TRAINERS = tuple(PKG + f".trainer.{t}_trainer_hybrid" for t in ("grpo", "dapo", "ppo"))

_TASK_PARAMS = (
    "td", "gamma", "lam", "adv_estimator", "experience_count", "tokenizer", "global_batch_size",
    "guarantee_order", "n_sample_per_prompt", "use_kl_in_reward", "multi_turn_enable",
)  # fmt: skip
_KL_PARAMS = ("logprob", "ref_logprob", "kl_penalty")
_COMPUTE_LOSS = ("self", "output", "batch", "forward_only", "non_loss_data", "kwargs")
_META = ("self", "meta_info")
_TASK_HELPERS = (
    Requirement("get_current_dp_range_indexes", ("experience_count", "assign_batch_size", "current_dp_rank")),
    Requirement("remove_padding_tensor_dict_to_dict", None),
    Requirement("pad_experience", None),
    Requirement("generate_mask", ("data_pad", "seq_lengths")),
    Requirement("truncate_rows", None),
    Requirement("padding_dict_to_tensor_dict", None),
)


_COLLECT = ("self", "output", "index", "use_vllm", "is_generate", "sync")
_DISPATCH = ("self", "experience_consumer_stage", "experience_columns", "experience_count", "tp_size", "cp_size",
             "cp_algo", "use_vllm", "indexes", "get_n_samples", "enable_partial_rollout", "is_generate")
_RC = _HERE + ".rollout_correction:"


def _rollout_correction_patches():
    worker = "ActorHybridWorkerBase"
    return [
        Patch(
            name="rollout correction: sampling rules", module=VALIDATE_CONFIG, target="validate_rl_args",
            params=("actor_config", "ref_config", "reward_config", "rl_config", "generate_config", "critic_config",
                    "vit_config"),
            make=_RC + "make_validate_rl_args",
        ),
        Patch(
            name="rollout correction: engine log-probs per output", module=VLLM_ENGINE,
            target="VLLMInferEngine._post_process_outputs", params=("self", "request_outputs"),
            make=_RC + "make_post_process_outputs",
            # the sync generate step goes engine.generate_sequences -> _post_process_outputs
            requires=(Requirement("VLLMInferEngine.generate_sequences", ("self", "idx_list", "kwargs")),),
        ),
        Patch(
            name="rollout correction: the column after generation", module=ACTOR_WORKER,
            target=f"{worker}.collect_transfer_dock_data", params=_COLLECT,
            make=_RC + "make_collect_transfer_dock_data",
            requires=(Requirement(f"{worker}.sync_generate_process",
                                  ("self", "batch_data", "experience_count", "index", "pad_token_id")),
                      Requirement("remove_padding_and_split_to_list", ("responses", "eos_token_id", "pad_token_id",
                                                                       "to_list"))),
        ),
        Patch(
            name="rollout correction: the column to the actor update", module=ACTOR_WORKER,
            target=f"{worker}.dispatch_transfer_dock_data", params=_DISPATCH,
            make=_RC + "make_dispatch_transfer_dock_data",
            requires=(Requirement(f"{worker}.update", ("self", "kl_ctrl", "skip_actor_log_prob")),),
        ),
        Patch(
            name="rollout correction: GRPO dock column", module=DATA_STRATEGY, target="DataStrategy.build_grpo",
            params=("self", "prompts_num", "n_samples_per_prompt", "metrics", "max_age", "gbs_train",
                    "addition_columns", "reuse_image_embeds", "dataset_additional_keys"),
            make=_RC + "make_build_with_column",
        ),
        Patch(
            name="rollout correction: DAPO dock column", module=DATA_STRATEGY, target="DataStrategy.build_dapo",
            params=("self", "should_filter", "max_num_prompt_in_batch", "td_max_len", "n_samples_per_prompt", "metrics",
                    "max_age", "gbs_train", "addition_columns", "addition_consumers", "dataset_additional_keys"),
            make=_RC + "make_build_with_column",
        ),
    ]


def _entropy_control_patches():
    return [
        Patch(
            name="adaptive entropy: the step's coefficient", module=ACTOR_WORKER,
            target="ActorHybridWorkerBase.update", params=("self", "kl_ctrl", "skip_actor_log_prob"),
            make=_HERE + ".entropy_control:make_worker_update",
        ),
        Patch(
            name="adaptive entropy: the step's entropy", module=ACTOR, target="Actor.update_actor",
            params=("self", "data", "kl_ctrl"), make=_HERE + ".entropy_control:make_update_actor",
            # the coefficient reaches the loss through this method, from the engine's entropy_coeff
            requires=(Requirement("Actor.get_loss_meta_func", ("self",)),),
        ),
    ]


def _task_patch(module: str, helpers=()) -> Patch:
    # The target is a Ray RemoteFunction; its Python function (under the timing decorator) has the params.
    return Patch(
        name="advantage estimators (compute_advantage task)",
        module=module,
        target="compute_advantage",
        params=None,
        make=_HERE + ".advantages:make_compute_advantage",
        requires=(Requirement("compute_advantage._function", _TASK_PARAMS),) + tuple(helpers),
    )


def _loss_patches(module: str, cls: str, make_loss: str, with_kl: bool):
    patches = [
        Patch(
            name=f"{cls} options",
            module=module,
            target=f"{cls}.add_loss_meta_info",
            params=_META,
            make=_HERE + ".losses:make_add_loss_meta_info",
        ),
        Patch(
            name=f"{cls} policy loss and aggregation",
            module=module,
            target=f"{cls}.compute_loss",
            params=_COMPUTE_LOSS,
            make=_HERE + f".losses:{make_loss}",
            requires=(
                Requirement(f"{cls}.compute_log_probs", ("self", "output", "batch", "skip_entropy", "kwargs")),
                Requirement("generate_mask", ("data_pad", "seq_lengths")),
                Requirement("MsProbe.save_data", None),
            ),
        ),
    ]
    if with_kl:
        patches.append(Patch(name="KL estimators (GRPO actor loss)", module=module, target="compute_kl_penalty",
                             params=_KL_PARAMS, make=_HERE + ".kl:make_compute_kl_penalty"))
    return patches


PATCHES = tuple(
    [
        Patch(
            name="rl_config keys and validation",
            module=RL_CONFIG,
            target="RLConfig.__init__",
            params=("self", "config_dict"),
            make=_HERE + ".config:make_rlconfig_init",
            requires=(Requirement("RLConfig.update", None),),
        ),
        _task_patch(COMPUTE_UTILS, _TASK_HELPERS),
        Patch(name="KL estimators (KL in reward)", module=COMPUTE_UTILS, target="compute_kl_penalty",
              params=_KL_PARAMS, make=_HERE + ".kl:make_compute_kl_penalty"),
        Patch(name="KL estimators", module=COMPUTE, target="compute_kl_penalty",
              params=_KL_PARAMS, make=_HERE + ".kl:make_compute_kl_penalty"),
        Patch(
            name="rlhf_ext rewards in the rule verifier",
            module=RULE_VERIFIER,
            target="verifier",
            params=("responses", "data", "config", "kwargs"),
            make=_HERE + ".rewards:make_verifier",
            # The names in verifier()'s local table (config.MINDSPEED_VERIFIERS) must still exist.
            requires=tuple(Requirement(fn, None) for fn in MINDSPEED_VERIFIERS.values()),
        ),
    ]
    + [_task_patch(t) for t in TRAINERS]
    + _loss_patches(GRPO_LOSS, "GRPOActorLossFunc", "make_grpo_compute_loss", with_kl=True)
    + _loss_patches(DAPO_LOSS, "DAPOActorLossFunc", "make_dapo_compute_loss", with_kl=False)
    + _rollout_correction_patches()
    + _entropy_control_patches()
)

for _patch in PATCHES:
    compat.register(_patch)


def _exit_2(message: str) -> None:
    import sys

    sys.stderr.write(f"rlhf_ext: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def _apply_or_exit(module) -> None:
    """Driver: a patch that does not fit stops the run with the message, not a traceback."""
    try:
        compat.apply_module(module)
    except MindSpeedRLCompatibilityError as exc:
        _exit_2(str(exc))


def _driver_rlconfig_guard(module) -> None:
    """Driver: an invalid rl_config value exits 2 with the message (Hydra would print a traceback)."""
    _apply_or_exit(module)
    import functools

    from .config import ConfigError

    cls = module.RLConfig
    patched = cls.__init__

    @functools.wraps(patched)
    def __init__(self, config_dict):
        try:
            patched(self, config_dict)
        except ConfigError as exc:
            _exit_2(str(exc))

    __init__.__rlhf_ext_patch__ = "rl_config validation (driver)"
    cls.__init__ = __init__
    compat.record(cls, "__init__", patched, __init__)


def _watch(role: str) -> None:
    hook = _apply_or_exit if role == "driver" else compat.apply_module
    for name in compat.patch_modules():
        if role == "driver" and name == RL_CONFIG:
            import_hooks.when_imported(name, _driver_rlconfig_guard)
        else:
            import_hooks.when_imported(name, hook)


def _patch_ray(module) -> None:
    from ..activation.ray_env import patch_ray

    patch_ray(module, MindSpeedRLCompatibilityError)


def activate(role: str) -> None:
    """Activation in one process (called by the ``rlhf_ext`` plugin when MindSpeed-RL is importable)."""
    if role == "driver":
        try:
            check_version()
        except MindSpeedRLCompatibilityError as exc:
            _exit_2(str(exc))
    _watch(role)
    import_hooks.when_imported("ray", _patch_ray)


def deactivate() -> None:
    """Undo everything :func:`activate` did in this process (tests only)."""
    from ..activation.ray_env import undo as undo_ray_env

    for name in compat.patch_modules():
        import_hooks.clear(name)
    compat.undo_all()
    undo_ray_env()


__all__ = [
    "PATCHES",
    "SUPPORTED_DESCRIPTION",
    "ConfigError",
    "ConfiguredName",
    "MindSpeedRLCompatibilityError",
    "activate",
    "applied",
    "check_version",
    "deactivate",
    "mindspeed_rl_version",
    "verify_all",
]

"""The ``rlhf_ext`` plugin for OpenRLHF 0.11.x: which seams are patched, and activation.

Seams (each checked against the parameter list it was written for, see :mod:`.compat`):

=============================================  ==========================================  ======================
where                                          what                                        runs in
=============================================  ==========================================  ======================
``experience_maker.RemoteExperienceMaker``     ``compute_advantages_and_returns``:          PPOTrainer actor
                                               registered estimators (:mod:`.advantages`)
``experience_maker.RemoteExperienceMaker``     ``make_experience``: KL settings, metrics    PPOTrainer actor
``experience_maker.compute_approx_kl``         ``--algo.kl.clip`` (:mod:`.kl`)              PPOTrainer actor
``ppo_actor.PolicyLoss`` (name)                registered losses, 4 aggregation modes       PolicyModelActor
``ppo_actor.ActorPPOTrainer.__init__``         configures the loss from ``args``            PolicyModelActor
``ppo_actor.ActorPPOTrainer.training_step``    KL settings, loss metrics                    PolicyModelActor
``ppo_actor.ActorPPOTrainer.ppo_train``        adaptive entropy coefficient                 PolicyModelActor
                                               (:mod:`.entropy_control`)
``ppo_actor.ActorPPOTrainer.ppo_train``        zero-advantage update counts,               PolicyModelActor
                                               attempted vs applied (:mod:`.updates`)
``ppo_actor.compute_approx_kl``                ``--algo.kl.clip`` for the KL loss           PolicyModelActor
``ppo_actor.ActorPPOTrainer.broadcast_to_vllm`` LoRA: merged weights under the base          PolicyModelActor
                                               model's names (:mod:`.lora_sync`)
``dpo_trainer.DPOTrainer``                     ``__init__``: SimPO loss (:mod:`.dpo`)       train_dpo ranks
``dpo_trainer.DPOTrainer``                     ``_get_batch_logps``: mean log-probs (SimPO) train_dpo ranks
``dpo_trainer.DPOTrainer``                     ``concatenated_forward``: no reference pass  train_dpo ranks
``dpo_trainer.DPOTrainer``                     ``save_logs_and_checkpoints``: margin        train_dpo ranks
``experience_maker.RemoteExperienceMaker``     ``make_experience_batch``: rollout-vs-       PPOTrainer actor
                                               training mismatch metrics (:mod:`.mismatch`)
``samples_generator.SamplesGenerator``         ``_dispatch_prompts_to_vllm`` and the name   PPOTrainer actor
                                               ``SamplingParams``: request the sampled
                                               tokens' log-probs (:mod:`.mismatch`)
``samples_generator.SamplesGenerator``         ``_generate_vllm``,                          PPOTrainer actor
                                               ``_process_response_into_experience``:
                                               zero-variance groups before dynamic
                                               filtering (:mod:`.prefilter`)
``vllm_engine.create_vllm_engines``            ``logprobs_mode`` for the same request       driver
                                               (:mod:`.mismatch`)
``ppo_trainer.BasePPOTrainer``                 ``init_checkpoint_states``, ``train_step``,  PPOTrainer actor
                                               ``ppo_train``, ``save_logs_and_checkpoints``,
                                               ``save_best_checkpoint``: run record
                                               (:mod:`.run_record`)
``ppo_trainer.BasePPOTrainer``                 ``_compute_rollout_stats``: a bounded        PPOTrainer actor
                                               sample of the step's rollouts
                                               (:mod:`.rollout_samples`)
``ppo_trainer.BasePPOTrainer``                 ``broadcast_to_vllm``, ``train_step``: async  PPOTrainer actor
                                               policy version and lag (:mod:`.policy_lag`)  (TrainingActor)
``samples_generator.SamplesGenerator``         ``generate_samples``: stamp the version      generator actor
                                               vLLM generates with (:mod:`.policy_lag`)
``vllm_engine._load_agent_executor``           an agent file's failure as one line          RolloutRayActor
                                               naming it (:mod:`.agents`)
``experience_maker.RemoteExperienceMaker``     ``make_experience``: the distillation        PPOTrainer actor
                                               teacher's log-probs / top-k per rollout
                                               batch, its own actor group (:mod:`.teacher`)
``ppo_actor.ActorPPOTrainer.training_step``    distillation term in the actor loss          PolicyModelActor
                                               (:mod:`.distill_loss`)
``ppo_actor.ActorPPOTrainer.training_step``    non-finite guard, real grad norm (:mod:`.guard`) PolicyModelActor
``ppo_actor.ActorPPOTrainer.ppo_train``        step count (guard), ships run-record data    PolicyModelActor
``deepspeed.DeepspeedStrategy.backward``       guard: checks before backward                PolicyModelActor
``deepspeed.DeepspeedStrategy.optimizer_step`` guard: gradients at the accumulation          PolicyModelActor
                                               boundary, DeepSpeed's skipped steps
``deepspeed.DeepspeedStrategy.{save,load}_ckpt`` the adaptive entropy controller in the      PolicyModelActor
                                               actor checkpoint (:mod:`.entropy_control`)
``launcher.BaseModelActor.execute_batch``      the reference follows the policy: weights    model actors
                                               out, mix in (:mod:`.ref_sync`)
``ppo_trainer.BasePPOTrainer.train_step``      the reference's periodic sync                PPOTrainer actor
                                               (:mod:`.ref_sync`)
``agent.MultiTurnAgentExecutor.execute``       each turn's reward and anchor state          RolloutRayActor
                                               (:mod:`.turn_credit`)
``samples_generator.SamplesGenerator``         ``_process_response_into_experience``: the  PPOTrainer actor
                                               turns into ``info`` for GiGPO
                                               (:mod:`.turn_credit`)
``agent.SingleTurnAgentExecutor``              ``_fetch_rewards_via_func``: rlhf_ext's      RolloutRayActor
                                               reward file's per-sample calls graded in
                                               shared batches (:mod:`.reward_batching`)
``ray.init``                                   plugin env in the job's runtime env          driver
``ray.init`` (returned, existing cluster)      every node can run the plugin               driver
                                               (:mod:`.node_check`)
``argparse`` (OpenRLHF's PPO parser only)      choices and flags (:mod:`.cli`); sleep       driver
                                               flags per target (:mod:`.sleep_mode`)
``argparse`` (OpenRLHF's DPO parser only)      ``--model.loss_type``, ``--model.simpo_gamma``  train_dpo ranks
                                               (:mod:`.dpo_cli`)
=============================================  ==========================================  ======================

Each module is patched when it is first imported in a process (:mod:`rlhf_ext.seams.import_hooks`),
so processes that never import it (vLLM workers) never load it; the driver checks all of them
before it parses arguments.
"""

from __future__ import annotations

# Keep this import light: activation runs at interpreter start-up, before torch is needed; the
# patch implementations (which import torch) load when their target module is imported.
from ...seams import import_hooks
from .. import flash_attn_fallback
from . import compat
from .compat import (
    SUPPORTED_DESCRIPTION,
    OpenRLHFCompatibilityError,
    Patch,
    Requirement,
    applied,
    check_version,
    openrlhf_version,
    verify_all,
)

_HERE = __name__
EXPERIENCE_MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
PPO_ACTOR = "openrlhf.trainer.ray.ppo_actor"
DPO_TRAINER = "openrlhf.trainer.dpo_trainer"
SAMPLES_GENERATOR = "openrlhf.trainer.ppo_utils.samples_generator"
VLLM_ENGINE = "openrlhf.trainer.ray.vllm_engine"
PPO_TRAINER = "openrlhf.trainer.ppo_trainer"
DEEPSPEED = "openrlhf.utils.deepspeed.deepspeed"
AGENT = "openrlhf.utils.agent"
LAUNCHER = "openrlhf.trainer.ray.launcher"

_KL_PARAMS = ("log_probs", "log_probs_base", "log_probs_old", "kl_estimator", "unbiased_gradient")
_POLICY_LOSS_INIT = (
    "self", "clip_eps_low", "clip_eps_high", "dual_clip", "token_level_loss", "policy_loss_type",
    "is_correction_level", "is_correction_mode", "is_correction_gating", "is_correction_threshold",
)  # fmt: skip
_POLICY_LOSS_FORWARD = (
    "self", "log_probs", "old_log_probs", "advantages", "action_mask", "rollout_log_probs",
    "dp_size", "batch_num_tokens", "global_batch_size",
)  # fmt: skip
_CREATE_VLLM_ENGINES = (
    "num_engines", "tensor_parallel_size", "pretrain", "seed", "full_determinism", "enable_prefix_caching",
    "enforce_eager", "max_model_len", "shared_pg", "gpu_memory_utilization", "vllm_enable_sleep", "logprobs_mode",
    "agent_func_path", "remote_rm_url", "max_images_per_prompt",
)  # fmt: skip
_DISPATCH_PROMPTS = ("self", "prompts", "labels", "images", "generate_kwargs")
_ACTOR_TRAINER_INIT = (
    "self", "strategy", "actor", "ema_model", "actor_optim", "actor_scheduler", "ema_beta",
    "micro_train_batch_size", "buffer_limit", "buffer_cpu_offload", "eps_clip", "tokenizer",
    "dataloader_pin_memory", "vllm_engines", "kwargs",
)  # fmt: skip
_DPO_TRAINER_INIT = (
    "self", "model", "ref_model", "strategy", "tokenizer", "optim", "train_dataloader", "eval_dataloader",
    "scheduler", "max_norm", "beta", "max_epochs", "save_hf_ckpt", "disable_ds_ckpt",
)  # fmt: skip
_DPO_FORWARD = ("self", "model", "chosen_ids", "c_mask", "reject_ids", "r_mask", "prompt_id_lens")

PATCHES = (
    Patch(
        name="reference model follows the policy (calls by name)",
        module=LAUNCHER,
        target="BaseModelActor.execute_batch",
        params=("self", "method_name", "all_data", "start_idx", "end_idx"),
        make=_HERE + ".ref_sync:make_execute_batch",
    ),
    Patch(
        name="reference model follows the policy (sync)",
        module=PPO_TRAINER,
        target="BasePPOTrainer.train_step",
        params=("self", "rollout_samples", "global_step"),
        make=_HERE + ".ref_sync:make_train_step",
    ),
    Patch(
        name="agent turns: each step's reward and anchor state",
        module=AGENT,
        target="MultiTurnAgentExecutor.execute",
        params=("self", "prompt", "label", "sampling_params", "max_length", "hf_tokenizer", "llm_engine", "images"),
        make=_HERE + ".turn_credit:make_execute",
        requires=(Requirement("MultiTurnAgentExecutor.__init__", ("self", "agent_instance_cls")),),
    ),
    Patch(
        name="agent turns into the samples' info (GiGPO)",
        module=SAMPLES_GENERATOR,
        target="SamplesGenerator._process_response_into_experience",
        params=("self", "response", "generate_kwargs"),
        make=_HERE + ".turn_credit:make_process_response_into_experience",
    ),
    Patch(
        name="reward file calls in shared batches",
        module=AGENT,
        target="SingleTurnAgentExecutor._fetch_rewards_via_func",
        params=("self", "queries_list", "prompts_list", "labels_list"),
        make=_HERE + ".reward_batching:make_fetch_rewards_via_func",
        requires=(Requirement("SingleTurnAgentExecutor.__init__", ("self", "remote_rm_url")),),
    ),
    Patch(
        name="advantage estimators",
        module=EXPERIENCE_MAKER,
        target="RemoteExperienceMaker.compute_advantages_and_returns",
        params=("self", "experiences"),
        make=_HERE + ".advantages:make_compute_advantages_and_returns",
        requires=(
            Requirement("apply_length_penalties", ("experiences", "args")),
            Requirement("compute_reward", ("r", "kl_coef", "kl", "action_mask", "reward_clip_range")),
            Requirement("RemoteExperienceMaker.get_cumulative_returns", ("self", "rewards", "action_mask", "gamma")),
            Requirement("RemoteExperienceMaker.__init__", None),
        ),
    ),
    Patch(
        name="KL clipping (KL reward)",
        module=EXPERIENCE_MAKER,
        target="compute_approx_kl",
        params=_KL_PARAMS,
        make=_HERE + ".kl:make_compute_approx_kl",
    ),
    Patch(
        name="KL settings and metrics (experience maker)",
        module=EXPERIENCE_MAKER,
        target="RemoteExperienceMaker.make_experience",
        params=("self", "samples_list"),
        make=_HERE + ".kl:make_make_experience",
    ),
    Patch(
        name="policy losses and aggregation modes",
        module=PPO_ACTOR,
        target="PolicyLoss",
        params=_POLICY_LOSS_INIT,
        make=_HERE + ".policy_loss:make_policy_loss_class",
        requires=(Requirement("PolicyLoss.forward", _POLICY_LOSS_FORWARD),),
    ),
    Patch(
        name="policy loss configuration",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.__init__",
        params=_ACTOR_TRAINER_INIT,
        make=_HERE + ".policy_loss:make_trainer_init",
    ),
    Patch(
        name="KL clipping and loss metrics (actor)",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.training_step",
        params=("self", "experience", "kl_ctl", "step", "loss_batch_info"),
        make=_HERE + ".policy_loss:make_training_step",
    ),
    Patch(
        name="adaptive entropy coefficient",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.ppo_train",
        params=("self", "kl_ctl"),
        make=_HERE + ".entropy_control:make_ppo_train",
    ),
    Patch(
        name="adaptive entropy coefficient: saved with the actor checkpoint",
        module=DEEPSPEED,
        target="DeepspeedStrategy.save_ckpt",
        params=("self", "model", "save_dir", "tag", "max_num", "max_mem", "client_state", "save_latest",
                "metric_value", "metric_key"),
        make=_HERE + ".entropy_control:make_save_ckpt",
    ),
    Patch(
        name="adaptive entropy coefficient: restored from the actor checkpoint",
        module=DEEPSPEED,
        target="DeepspeedStrategy.load_ckpt",
        params=("self", "model", "load_dir", "tag", "load_module_strict", "load_optimizer_states",
                "load_lr_scheduler_states", "load_module_only"),
        make=_HERE + ".entropy_control:make_load_ckpt",
    ),
    Patch(
        name="zero-advantage update counts",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.ppo_train",
        params=("self", "kl_ctl"),
        make=_HERE + ".updates:make_ppo_train",
    ),
    Patch(
        name="KL clipping (KL loss)",
        module=PPO_ACTOR,
        target="compute_approx_kl",
        params=_KL_PARAMS,
        make=_HERE + ".kl:make_compute_approx_kl",
    ),
    Patch(
        name="LoRA weight sync: merged weights, base names",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.broadcast_to_vllm",
        params=("self",),
        make=_HERE + ".lora_sync:make_broadcast_to_vllm",
        # the sync's channels, as upstream uses them (CUDA IPC handles, the barrier after each tensor)
        requires=(Requirement("get_physical_gpu_id", None), Requirement("torch_dist_barrier_and_cuda_sync", None)),
    ),
    Patch(
        name="preference loss type (SimPO)",
        module=DPO_TRAINER,
        target="DPOTrainer.__init__",
        params=_DPO_TRAINER_INIT,
        make=_HERE + ".dpo:make_trainer_init",
        # The swapped-in loss keeps DPOLoss's call contract; the trainer reads these attributes.
        requires=(Requirement("DPOLoss", ("self", "beta", "label_smoothing", "ipo")),),
    ),
    Patch(
        name="length-normalised log-probs (SimPO)",
        module=DPO_TRAINER,
        target="DPOTrainer._get_batch_logps",
        params=("self", "per_token_logps", "attention_mask", "prompt_id_lens"),
        make=_HERE + ".dpo:make_get_batch_logps",
    ),
    Patch(
        name="reference-free forward (SimPO)",
        module=DPO_TRAINER,
        target="DPOTrainer.concatenated_forward",
        params=_DPO_FORWARD,
        make=_HERE + ".dpo:make_concatenated_forward",
    ),
    Patch(
        name="preference margin metrics",
        module=DPO_TRAINER,
        target="DPOTrainer.save_logs_and_checkpoints",
        params=("self", "args", "global_step", "step_bar", "logs_dict", "client_states"),
        make=_HERE + ".dpo:make_save_logs",
    ),
    Patch(
        name="rollout mismatch metrics",
        module=EXPERIENCE_MAKER,
        target="RemoteExperienceMaker.make_experience_batch",
        params=("self", "rollout_samples"),
        make=_HERE + ".mismatch:make_make_experience_batch",
        requires=(Requirement("RemoteExperienceMaker.make_experience", ("self", "samples_list")),),
    ),
    Patch(
        name="rollout log-probs request (dispatch)",
        module=SAMPLES_GENERATOR,
        target="SamplesGenerator._dispatch_prompts_to_vllm",
        params=_DISPATCH_PROMPTS,
        make=_HERE + ".mismatch:make_dispatch_prompts_to_vllm",
        requires=(Requirement("SamplesGenerator._process_response_into_experience", ("self", "response", "generate_kwargs")),),
    ),
    Patch(
        name="rollout log-probs request (SamplingParams)",
        module=SAMPLES_GENERATOR,
        target="SamplingParams",
        params=None,
        make=_HERE + ".mismatch:make_sampling_params",
    ),
    Patch(
        name="zero-variance groups before dynamic filtering (responses)",
        module=SAMPLES_GENERATOR,
        target="SamplesGenerator._process_response_into_experience",
        params=("self", "response", "generate_kwargs"),
        make=_HERE + ".prefilter:make_process_response_into_experience",
    ),
    Patch(
        name="zero-variance groups before dynamic filtering (generation)",
        module=SAMPLES_GENERATOR,
        target="SamplesGenerator._generate_vllm",
        params=("self", "dataloader_iter", "num_prompts", "dynamic_filtering", "generate_kwargs"),
        make=_HERE + ".prefilter:make_generate_vllm",
    ),
    Patch(
        name="rollout log-probs mode (vLLM engines)",
        module=VLLM_ENGINE,
        target="create_vllm_engines",
        params=_CREATE_VLLM_ENGINES,
        make=_HERE + ".mismatch:make_create_vllm_engines",
    ),
    Patch(
        name="non-finite guard and real grad norm (actor)",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.training_step",
        params=("self", "experience", "kl_ctl", "step", "loss_batch_info"),
        make=_HERE + ".guard:make_training_step",
    ),
    Patch(
        name="guard step count (actor)",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.ppo_train",
        params=("self", "kl_ctl"),
        make=_HERE + ".guard:make_actor_ppo_train",
    ),
    Patch(
        name="run record: ship metrics and events (actor)",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.ppo_train",
        params=("self", "kl_ctl"),
        make=_HERE + ".run_record:make_actor_ppo_train",
    ),
    Patch(
        name="non-finite guard: before backward",
        module=DEEPSPEED,
        target="DeepspeedStrategy.backward",
        params=("self", "loss", "model", "_optimizer", "kwargs"),
        make=_HERE + ".guard:make_backward",
    ),
    Patch(
        name="non-finite guard: gradients before the optimizer step",
        module=DEEPSPEED,
        target="DeepspeedStrategy.optimizer_step",
        params=("self", "_optimizer", "model", "_scheduler", "name", "kwargs"),
        make=_HERE + ".guard:make_optimizer_step",
        requires=(Requirement("DeepspeedStrategy.get_grad_norm", ("self", "model")),),
    ),
    Patch(
        name="run record: start / resume",
        module=PPO_TRAINER,
        target="BasePPOTrainer.init_checkpoint_states",
        params=("self",),
        make=_HERE + ".run_record:make_init_checkpoint_states",
    ),
    Patch(
        name="run record: current step",
        module=PPO_TRAINER,
        target="BasePPOTrainer.train_step",
        params=("self", "rollout_samples", "global_step"),
        make=_HERE + ".run_record:make_train_step",
    ),
    Patch(
        name="run record: actor results and guard stops",
        module=PPO_TRAINER,
        target="BasePPOTrainer.ppo_train",
        params=("self", "global_steps"),
        make=_HERE + ".run_record:make_ppo_train",
    ),
    Patch(
        name="run record: metrics lines and checkpoints",
        module=PPO_TRAINER,
        target="BasePPOTrainer.save_logs_and_checkpoints",
        params=("self", "global_step", "logs_dict", "client_states"),
        make=_HERE + ".run_record:make_save_logs_and_checkpoints",
    ),
    Patch(
        name="run record: eval metrics and best checkpoints",
        module=PPO_TRAINER,
        target="BasePPOTrainer.save_best_checkpoint",
        params=("self", "eval_metrics", "global_step", "client_states"),
        make=_HERE + ".run_record:make_save_best_checkpoint",
    ),
    Patch(
        name="run record: a bounded sample of the step's rollouts",
        module=PPO_TRAINER,
        target="BasePPOTrainer._compute_rollout_stats",
        params=("self", "experiences"),
        make=_HERE + ".rollout_samples:make_compute_rollout_stats",
    ),
    Patch(
        name="async policy lag: stamp the version vLLM generates with",
        module=SAMPLES_GENERATOR,
        target="SamplesGenerator.generate_samples",
        params=("self", "generate_kwargs"),
        make=_HERE + ".policy_lag:make_generate_samples",
    ),
    Patch(
        name="async policy lag: publish the version a weight sync put into vLLM",
        module=PPO_TRAINER,
        target="BasePPOTrainer.broadcast_to_vllm",
        params=("self",),
        make=_HERE + ".policy_lag:make_broadcast_to_vllm",
    ),
    Patch(
        name="async policy lag: the step's lag from its rollouts' versions",
        module=PPO_TRAINER,
        target="BasePPOTrainer.train_step",
        params=("self", "rollout_samples", "global_step"),
        make=_HERE + ".policy_lag:make_train_step",
    ),
    Patch(
        name="agent file failures named (rollout actors)",
        module=VLLM_ENGINE,
        target="_load_agent_executor",
        params=("agent_func_path",),
        make=_HERE + ".agents:make_load_agent_executor",
    ),
    Patch(
        name="distillation: teacher values per rollout batch",
        module=EXPERIENCE_MAKER,
        target="RemoteExperienceMaker.make_experience",
        params=("self", "samples_list"),
        make=_HERE + ".teacher:make_make_experience",
        requires=(Requirement("RayActorGroup.async_run_method_batch", ("self", "method_name", "kwargs")),),
    ),
    Patch(
        # after the guard's entry: this wrapper is outside it, so its loss hook runs before the guard's
        name="distillation term in the actor loss",
        module=PPO_ACTOR,
        target="ActorPPOTrainer.training_step",
        params=("self", "experience", "kl_ctl", "step", "loss_batch_info"),
        make=_HERE + ".distill_loss:make_training_step",
    ),
)

for _patch in PATCHES:
    compat.register(_patch)


def _apply_or_exit(module) -> None:
    """Driver: a patch that does not fit stops the run with the message, not with a traceback."""
    try:
        compat.apply_module(module)
    except OpenRLHFCompatibilityError as exc:
        import sys

        sys.stderr.write(f"rlhf_ext: error: {exc}\n")
        raise SystemExit(2) from None


def _watch_openrlhf_modules(role: str) -> None:
    hook = _apply_or_exit if role == "driver" else compat.apply_module
    for name in compat.patch_modules():
        import_hooks.when_imported(name, hook)


def _before_ray_init(kwargs: dict) -> dict:
    from ..retarget import cpu_processes
    from ..retarget.state import applied_backend
    from .run_record import start_prepared_record

    kwargs = cpu_processes.ray_init_kwargs(kwargs, applied_backend())  # the CPU target: no dashboard
    start_prepared_record()  # the driver's run record (config.json), once the run really starts
    return kwargs


def _after_ray_init(kwargs: dict) -> None:
    from .node_check import after_ray_init

    after_ray_init(kwargs)  # joined an existing cluster: every node can run the plugin, or one line and exit


def _patch_ray(module, role: str = "") -> None:
    from ..activation.ray_env import after_ray_init, before_actor_class, before_ray_init, patch_ray

    patch_ray(module, OpenRLHFCompatibilityError)
    before_ray_init(_before_ray_init)
    if role == "driver":
        after_ray_init(_after_ray_init)
    apply = _apply_or_exit if role == "driver" else compat.apply_module

    def patch_bases_first(cls) -> None:
        import sys

        for base in cls.__mro__[1:]:
            module = sys.modules.get(base.__module__)
            if module is not None and base.__module__ in compat.patch_modules():
                apply(module)

    before_actor_class(patch_bases_first)


def _watch_ray(role: str = "") -> None:
    import_hooks.when_imported("ray", lambda module: _patch_ray(module, role))


def activate(role: str) -> None:
    """Activation of the ``rlhf_ext`` plugin in one process (called by :func:`rlhf_ext.patches.activate`).

    In the driver an unsupported OpenRLHF release stops the run right here, before OpenRLHF is
    imported; other processes find out when they import a patched module.
    """
    if role == "driver":
        check_version()
    flash_attn_fallback.install()
    # The device retarget (NPU / CPU) must be in place in every process before OpenRLHF's
    # modules load; on CUDA it does nothing.
    from ..retarget import apply_openrlhf_retarget

    apply_openrlhf_retarget()
    _watch_openrlhf_modules(role)
    _watch_ray(role)
    if role == "driver":
        from .cli import install_argparse_hook

        install_argparse_hook()


def deactivate() -> None:
    """Undo everything :func:`activate` did in this process (tests only)."""
    from ..activation.ray_env import undo as undo_ray_env
    from .cli import uninstall_argparse_hook

    for name in compat.patch_modules() + ["ray"]:
        import_hooks.clear(name)
    compat.undo_all()
    undo_ray_env()
    uninstall_argparse_hook()
    flash_attn_fallback.uninstall()


__all__ = [
    "PATCHES",
    "SUPPORTED_DESCRIPTION",
    "OpenRLHFCompatibilityError",
    "activate",
    "applied",
    "check_version",
    "deactivate",
    "openrlhf_version",
    "verify_all",
]

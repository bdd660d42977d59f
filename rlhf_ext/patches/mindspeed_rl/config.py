"""The plugin's ``rl_config`` keys: names, validation, and how the settings reach each process.

New keys (all optional; absent means MindSpeed-RL's own behaviour, unchanged):

=========================  =====================================================================
key                        meaning
=========================  =====================================================================
``adv_estimator``          also every name in :func:`rlhf_ext.algorithms.available_advantages`
``adv_estimator_options``  keyword options of that estimator, e.g. ``{k: 4}`` for ``passk``
``policy_loss_type``       ``ppo`` (the clipped surrogate), ``gspo`` (sequence ratio), or any
                           other name in :func:`rlhf_ext.algorithms.available_policy_losses`
                           (``cispo``, ``sapo``, ``gmpo``, ``clip_cov``, ``kl_cov``, ``dppo_tv``, ...)
``policy_loss_options``    keyword options of that loss, e.g. ``{tau_pos: 1.0, tau_neg: 1.05}``;
                           the clip range comes from ``clip_ratio`` / ``clip_ratio_low/high``
``loss_agg_mode``          ``token-mean``, ``seq-mean-token-mean``, ``seq-mean-token-sum``,
                           ``seq-mean-token-sum-norm`` (Dr.GRPO's constant normaliser)
``loss_agg_max_len``       the constant of ``seq-mean-token-sum-norm`` (the generation budget)
``kl_penalty``             also ``k1``, ``k2``, ``k3``, ``k3+`` (k3's value, k2's gradient)
``kl_clip``                ``[lo, hi]`` or ``none``: replaces the hard-coded [-10, 10]
``kl_penalty``             also ``k3_bias_corrected`` ((pi / pi_old) k3, DeepSeek-V3.2; the GRPO
                           actor's KL loss only, not ``use_kl_in_reward``)
``top_entropy_quantile``   only that top fraction of response tokens by entropy carries policy
                           gradient (arXiv 2506.01939); the loss then computes the entropy
``off_policy_mask_threshold``  DeepSeek-V3.2's off-policy sequence mask against ``old_log_prob``
``mask_truncated_completions`` refused: MindSpeed-RL's actor batch has no truncation flag
``rollout_is``             rollout/training mismatch correction (docs/rollout_correction.md):
                           ``token``, ``sequence`` or ``geometric`` importance weights from the
                           vLLM engine's log-probs; ``rollout_is_threshold`` (``C`` truncates, default
                           2; ``[lo, hi]`` / ``"lo_hi"`` masks outside, IcePop),
                           ``rollout_is_batch_normalize``, ``rollout_rs`` / ``rollout_rs_threshold``
                           (rejection, verl's option names plus rlhf_ext's), ``rollout_correction_bypass``;
                           OpenRLHF's names. Refused with partial rollout, the async engine,
                           multi-turn, DAPO's dynamic sampling and the transfer queue (the
                           log-prob column is carried only on the sync transfer-dock path), and
                           at ``validate_rl_args`` when the sampling settings make vLLM's log-probs
                           differ from the trainer's (:mod:`.rollout_correction`)
``distillation``           on-policy distillation from the reference slot's model (the teacher), verl's
                           ``DistillationLossConfig`` names (:mod:`.distillation`, docs/distillation.md)
``adaptive_entropy``       the entropy bonus's coefficient steps toward a target entropy each step
                           (Skywork-OR1; TRL's names, initial ``entropy_coeff``; :mod:`.entropy_control`)
``verifier_function``      also ``rlhf_ext:NAME`` (an rlhf_ext reward or preset), weights as usual;
                           rlhf_ext rewards grade with a per-sample timeout of
                           ``verifier_timeout`` seconds (a MindSpeed-RL key it never reads)
=========================  =====================================================================

How they travel: ``rl_config`` is rebuilt from the Hydra dict in every Ray worker that needs it
(the patched ``RLConfig.__init__`` validates it again there), and MindSpeed-RL hands only a few of
its values to the advantage task and to the loss: ``adv_estimator`` (to ``compute_advantage``)
and ``kl_penalty`` (to ``compute_kl_penalty`` and, in ``meta_info``, to the actor loss). The
patched ``RLConfig`` therefore turns those two values into :class:`ConfiguredName` -- a ``str``
equal to the original name that also carries the rlhf_ext settings -- so the settings ride the
paths MindSpeed-RL already has, through pickling, with no global state.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .entropy_control import check_adaptive_entropy

# What MindSpeed-RL 2.1.0 implements itself; these keep its exact code paths.
MINDSPEED_ESTIMATORS = ("group_norm", "gae")
MINDSPEED_KL_PENALTIES = ("kl", "abs", "mse", "low_var_kl")
RLHF_EXT_KL_PENALTIES = ("k1", "k2", "k3", "k3+", "k3_bias_corrected")
BIAS_CORRECTED_KL = "k3_bias_corrected"  # needs the old log-probs: only the actor loss has them
# rule_verifier.verifier's local table in 2.1.0: name -> module-level function it calls.
MINDSPEED_VERIFIERS = {
    "acc": "accuracy_reward",
    "format": "format_reward",
    "step": "reasoning_steps_reward",
    "strict_format": "strict_format_reward",
    "base_acc": "base_model_accuracy_reward",
    "math_17k_acc": "math_17k_accuracy_reward",
    "acc_for_dapo": "accuracy_reward_for_dapo",
    "acc_for_ppo": "ppo_accuracy_reward",
    "math_verify_reward": "math_verify_accuracy_reward",
    "retool_reward": "retool_reward",
}
POLICY_LOSS_TYPES = ("ppo", "gspo")
BYPASS_LOSS = "bypass_mode"  # registered, but its old log-probs must be the rollout's (check_policy_loss)
# Registered estimators that whiten token advantages over the batch (REINFORCE++, arXiv 2501.03262).
WHITENED_ESTIMATORS = ("reinforce_pp", "reinforce_pp_baseline")

NEW_KEYS = ("adv_estimator_options", "policy_loss_type", "loss_agg_mode", "loss_agg_max_len", "kl_clip",
            "policy_loss_options", "top_entropy_quantile", "off_policy_mask_threshold", "mask_truncated_completions",
            "distillation", "adaptive_entropy")
# The loss options the plugin sets from MindSpeed-RL's own clip keys (not allowed in policy_loss_options),
# and their old names (accepted by the losses for one release).
CLIP_OPTIONS = ("clip_ratio_low", "clip_ratio_high", "eps_low", "eps_high")
# The OpenRLHF-side names of issue 23's correction (patches/openrlhf/rollout_correction.py).
ROLLOUT_CORRECTION_KEYS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                           "rollout_rs_threshold", "rollout_correction_bypass")
DEFAULT_KL_CLIP = (-10.0, 10.0)  # MindSpeed-RL's hard-coded clamp of low_var_kl


class ConfigError(ValueError):
    """An ``rl_config`` value rlhf_ext cannot run; the message names the key and the valid values."""


class ConfiguredName(str):
    """A MindSpeed-RL option value (``adv_estimator``, ``kl_penalty``) that carries rlhf_ext's settings.

    Compares, hashes and prints as the plain name, so MindSpeed-RL's own ``== "gae"`` checks and
    logs are unchanged; pickles with its settings (Ray sends it to the advantage task and the
    actor workers).
    """

    settings: Dict[str, Any]

    def __new__(cls, value: str, settings: Optional[Mapping[str, Any]] = None):
        obj = super().__new__(cls, value)
        obj.settings = dict(settings or {})
        return obj

    def __reduce__(self):
        return (ConfiguredName, (str(self), self.settings))


def settings_of(value) -> Dict[str, Any]:
    """The rlhf_ext settings carried by ``value`` ({} for a plain string: MindSpeed-RL behaviour)."""
    return dict(getattr(value, "settings", None) or {})


def _choices(names: Sequence[str]) -> str:
    return ", ".join(names)


def available_estimators() -> List[str]:
    from rlhf_ext.algorithms import available_advantages

    return list(MINDSPEED_ESTIMATORS) + [n for n in available_advantages() if n not in MINDSPEED_ESTIMATORS]


def check_estimator(name, options) -> Dict[str, Any]:
    valid = available_estimators()
    from rlhf_ext.algorithms import available_token_advantages

    if name in available_token_advantages():  # rlhf_ext.algorithms.token_estimators: refused by name
        from rlhf_ext.algorithms.token_estimators import host_lacks

        raise ConfigError(host_lacks(name, "rl_config.adv_estimator", "MindSpeed-RL's actor computes only the sampled "
                                     "tokens' log-probs, and its advantage task sees token rewards and masks only"))
    if not isinstance(name, str) or name not in valid:
        raise ConfigError(f"rl_config.adv_estimator={name!r} is not a known advantage estimator; valid: {_choices(valid)}")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"rl_config.adv_estimator_options must be a mapping like {{k: 4}}, got {options!r}")
    options = {str(k): v for k, v in options.items()}
    if name in MINDSPEED_ESTIMATORS:
        if options:
            raise ConfigError(
                f"rl_config.adv_estimator_options {options} given, but MindSpeed-RL's own {name!r} takes no options"
            )
        return options
    import inspect

    from rlhf_ext.algorithms import get_advantage

    from rlhf_ext.algorithms import host_inputs

    fn = get_advantage(name)
    taken = host_inputs(fn)
    if "turns" in taken:
        raise ConfigError(
            f"rl_config.adv_estimator={name!r} assigns an advantage per agent turn, and MindSpeed-RL has no multi-turn "
            "agent rollouts (its advantage task sees token rewards and masks only); GiGPO runs on OpenRLHF's agent "
            "executor")
    if "components" in taken:
        raise ConfigError(
            f"rl_config.adv_estimator={name!r} normalises each reward component separately, and MindSpeed-RL's "
            "advantage task receives only the summed rm_scores (no components); use group_norm or another estimator"
        )
    for key in options:
        if key in taken:
            raise ConfigError(f"rl_config.adv_estimator_options.{key}: {key} comes from the rollouts, not from the config")
    params = inspect.signature(fn).parameters
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
    named = [p for p, v in params.items() if v.kind == v.KEYWORD_ONLY]
    for key in options:
        if key not in named and not takes_kwargs:
            raise ConfigError(
                f"rl_config.adv_estimator_options: {name!r} has no option {key!r}; it takes: {_choices(named) or '(none)'}"
            )
    if name == "passk" and "k" not in options:
        raise ConfigError("rl_config.adv_estimator=passk needs rl_config.adv_estimator_options.k (e.g. {k: 4})")
    return options


def available_policy_loss_types() -> List[str]:
    from rlhf_ext.algorithms import available_policy_losses

    return list(POLICY_LOSS_TYPES) + [n for n in available_policy_losses()
                                      if n not in POLICY_LOSS_TYPES and n != BYPASS_LOSS]


def check_policy_loss(value) -> Optional[str]:
    if value is None:
        return None
    if value == BYPASS_LOSS:  # rlhf_ext.algorithms.bypass_mode: its old log-probs must be the rollout's
        raise ConfigError(
            "rl_config.policy_loss_type=bypass_mode needs the vLLM rollout log-probs in place of the old ones, but "
            "MindSpeed-RL's actor hands its loss the recomputed old_log_prob; the same loss is "
            "rl_config.rollout_correction_bypass: true with policy_loss_type ppo (verl's loss_type=ppo_clip; "
            "rejection with rollout_rs, no rollout_is) or pg with rollout_is: token (loss_type=reinforce)")
    valid = available_policy_loss_types()
    if value not in valid:
        raise ConfigError(f"rl_config.policy_loss_type={value!r} is not known; valid: {_choices(valid)}")
    return value


def check_policy_loss_options(loss_type, options) -> Dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"rl_config.policy_loss_options must be a mapping like {{tau_neg: 1.05}}, got {options!r}")
    options = {str(k): v for k, v in options.items()}
    if options and loss_type is None:
        raise ConfigError("rl_config.policy_loss_options needs rl_config.policy_loss_type")
    import inspect

    from rlhf_ext.algorithms import get_policy_loss, ratio_cap_refusal

    params = inspect.signature(get_policy_loss(loss_type)).parameters if options else {}
    named = [p for p, v in params.items() if v.kind == v.KEYWORD_ONLY and p not in CLIP_OPTIONS]
    for key in options:
        if key in CLIP_OPTIONS:
            raise ConfigError(f"rl_config.policy_loss_options.{key}: the clip range comes from rl_config.clip_ratio "
                              "(or clip_ratio_low / clip_ratio_high with clip_higher_enable)")
        if key not in named:
            reason = ratio_cap_refusal(loss_type, {key: options[key]})
            if reason:  # dual_clip / delta on a loss they do not fit: say why, not only that the name is unknown
                raise ConfigError(f"rl_config.policy_loss_options.{key}: {reason}")
            raise ConfigError(f"rl_config.policy_loss_options: {loss_type!r} has no option {key!r}; "
                              f"it takes: {_choices(named) or '(none)'}")
    return options


def check_loss_agg(mode, max_len) -> Tuple[Optional[str], Optional[int]]:
    from rlhf_ext.algorithms import LOSS_AGG_MODES

    if mode is not None and mode not in LOSS_AGG_MODES:
        raise ConfigError(f"rl_config.loss_agg_mode={mode!r} is not known; valid: {_choices(LOSS_AGG_MODES)}")
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ConfigError(f"rl_config.loss_agg_max_len must be a positive integer, got {max_len!r}")
        if mode != "seq-mean-token-sum-norm":
            raise ConfigError("rl_config.loss_agg_max_len is only used by loss_agg_mode=seq-mean-token-sum-norm")
    return mode, max_len


def check_kl(penalty, clip) -> Optional[Tuple[float, float]]:
    """Validate ``kl_penalty`` and ``kl_clip``; returns the clip: None = MindSpeed-RL's, () = no clamp."""
    valid = MINDSPEED_KL_PENALTIES + RLHF_EXT_KL_PENALTIES
    if penalty not in valid:
        raise ConfigError(f"rl_config.kl_penalty={penalty!r} is not a known KL estimator; valid: {_choices(valid)}")
    if clip is None:
        return None
    from rlhf_ext.algorithms.kl import parse_kl_clip  # one rule for every host; torch loads here, not at start-up

    try:
        parsed = parse_kl_clip(clip, setting="rl_config.kl_clip", form="[lo, hi]")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return () if parsed is None else parsed


def check_verifiers(functions, weights) -> List[str]:
    """Every name must be MindSpeed-RL's or ``rlhf_ext:SPEC`` with a valid spec; returns the rlhf_ext specs."""
    from rlhf_ext.rewards import parse_reward_spec
    from rlhf_ext.rewards.reward_file import SHORT_FORM_PREFIX, short_form_spec

    if isinstance(functions, str) or not isinstance(functions, Sequence):
        raise ConfigError(f"rl_config.verifier_function must be a list of names, got {functions!r}")
    specs = []
    for name in functions:
        spec = short_form_spec(name)
        if spec is not None:
            try:
                parse_reward_spec(spec)
            except ValueError as exc:  # UnknownRewardError is a ValueError and lists the names
                raise ConfigError(f"rl_config.verifier_function entry {name!r}: {exc}") from None
            specs.append(spec)
        elif name not in MINDSPEED_VERIFIERS:
            from rlhf_ext.rewards import REWARD_PRESETS, available_rewards

            raise ConfigError(
                f"rl_config.verifier_function entry {name!r} is not a known reward; MindSpeed-RL's: "
                f"{_choices(MINDSPEED_VERIFIERS)}; rlhf_ext's: "
                f"{_choices(SHORT_FORM_PREFIX + n for n in list(REWARD_PRESETS) + available_rewards())}"
            )
    if weights is not None and len(weights) != len(functions):
        raise ConfigError(
            f"rl_config.verifier_weight has {len(weights)} entries for {len(functions)} verifier_function entries"
        )
    return specs


def check_token_masks(ours: Mapping[str, Any], source: Mapping[str, Any]) -> Dict[str, Any]:
    """The three loss-mask keys of issue 22, and ``kl_penalty: k3_bias_corrected``'s requirements."""
    import math

    out: Dict[str, Any] = {}
    q = ours.get("top_entropy_quantile")
    if q is not None:
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
            raise ConfigError(f"rl_config.top_entropy_quantile must be in (0, 1], got {q!r}")
        out["top_entropy_quantile"] = float(q)
    delta = ours.get("off_policy_mask_threshold")
    if delta is not None:
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not (delta >= 0 and math.isfinite(delta)):
            raise ConfigError(f"rl_config.off_policy_mask_threshold must be a finite number >= 0, got {delta!r}")
        out["off_policy_mask_threshold"] = float(delta)
    if ours.get("mask_truncated_completions"):
        raise ConfigError(
            "rl_config.mask_truncated_completions: MindSpeed-RL 2.1.0's actor batch carries no truncation flag "
            "(no finish reason reaches the loss, only response_length), so truncated responses cannot be told apart; "
            "use DAPO's overlong shaping in the reward instead (rl_config.overlong_buffer_enable)")
    if source.get("kl_penalty") == BIAS_CORRECTED_KL and source.get("use_kl_in_reward"):
        raise ConfigError(
            f"rl_config.kl_penalty={BIAS_CORRECTED_KL} weights k3 by pi/pi_old, which exists only in the actor's KL "
            "loss: it cannot be used with use_kl_in_reward (the reward's KL has no old log-probs)")
    return out


def _rejection_spec(options, thresholds) -> Dict[str, Any]:
    """``rollout_rs`` and ``rollout_rs_threshold`` -> ``{option: threshold}``
    (:func:`rlhf_ext.algorithms.rollout_correction.rejection_thresholds`)."""
    from rlhf_ext.algorithms.rollout_correction import rejection_thresholds

    try:
        return rejection_thresholds(options, thresholds, options_key="rl_config.rollout_rs",
                                    thresholds_key="rl_config.rollout_rs_threshold")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


# rl_config settings under which the rollout log-prob column would not reach the actor (docs/rollout_correction.md)
_CORRECTION_REFUSED_WITH = (
    ("partial_rollout_max_split", lambda v: v is not None and int(v) > 1,
     "partial rollout concatenates pieces generated under different weights, and its pieces' log-probs are not kept"),
    ("async_engine", bool, "the async generate path is not wired (only the sync path keeps the engine's log-probs)"),
    ("multi_turn_enable", bool, "multi-turn rollouts interleave tool tokens no engine sampled"),
    ("filter_groups_enable", bool, "DAPO's dynamic sampling copies a fixed list of columns from its sampling dock "
                                   "(DynamicSampling.dynamic_sampling), which would drop the rollout log-probs"),
    ("data_strategy", lambda v: str(v).strip().lower() in ("tq", "queue", "transfer_queue"),
     "the transfer queue registers fixed per-consumer columns; use the transfer dock (data_strategy: td)"),
)


def check_rollout_correction(source: Dict[str, Any]) -> Dict[str, Any]:
    """Pop the rollout-correction keys (OpenRLHF's names); ``{}`` when none is switched on, else
    ``{"rollout_correction": {...}}``: plain values (they pickle with :class:`ConfiguredName`) from
    which :func:`rollout_correction_of` builds the :class:`rlhf_ext.algorithms.RolloutCorrection`.

    Checks here are the ones ``rl_config`` alone can answer; the sampling settings are checked in
    ``validate_rl_args``, which sees ``generate_config`` too (:mod:`.rollout_correction`).
    """
    given = {key: _plain(source.pop(key)) for key in ROLLOUT_CORRECTION_KEYS if key in source}
    level = given.get("rollout_is")
    if level is False:
        level = None
    rejection = _rejection_spec(given.get("rollout_rs"), given.get("rollout_rs_threshold"))
    threshold = given.get("rollout_is_threshold")
    normalize = given.get("rollout_is_batch_normalize") or False
    bypass = given.get("rollout_correction_bypass") or False
    for key, value in (("rollout_is_batch_normalize", normalize), ("rollout_correction_bypass", bypass)):
        if not isinstance(value, bool):
            raise ConfigError(f"rl_config.{key} must be true or false, got {value!r}")
    if level is None and not rejection:
        if threshold is not None or normalize or bypass:
            on = [k for k, v in (("rollout_is_threshold", threshold is not None), ("rollout_is_batch_normalize", normalize),
                                 ("rollout_correction_bypass", bypass)) if v]
            raise ConfigError(f"rl_config.{on[0]} needs rl_config.rollout_is or rl_config.rollout_rs")
        return {}
    if level is not None and level not in ("token", "sequence", "geometric"):
        raise ConfigError(f"rl_config.rollout_is={level!r} is not known; valid: token, sequence, geometric")
    if isinstance(threshold, (list, tuple)):
        threshold = list(threshold)
    spec = {"is_level": level, "is_threshold": 2.0 if threshold is None else threshold,
            "batch_normalize": normalize, "rejection": rejection, "bypass": bypass}
    from rlhf_ext.algorithms.rollout_correction import parse_is_threshold, rejection_bounds

    checks = [("rollout_is_threshold", parse_is_threshold, (_pair_of(spec["is_threshold"]),))] if level else []
    checks += [("rollout_rs", rejection_bounds, (option, _pair_of(t))) for option, t in rejection.items()]
    for key, check, args in checks:
        try:
            check(*args)
        except ValueError as exc:
            raise ConfigError(f"rl_config.{key}: {exc}") from None
    for key, refused, why in _CORRECTION_REFUSED_WITH:
        value = _plain(source.get(key))
        if value is not None and refused(value):
            raise ConfigError(f"rl_config.{key}={value!r} cannot be combined with rollout correction "
                              f"(rl_config.rollout_is / rollout_rs): {why} (docs/rollout_correction.md)")
    return {"rollout_correction": spec}


def _pair_of(value):
    return tuple(value) if isinstance(value, list) else value


def rollout_correction_of(settings_or_spec: Mapping[str, Any]):
    """``(RolloutCorrection, bypass)`` from the plain spec (or the settings holding it); ``(None, False)`` without."""
    spec = settings_or_spec.get("rollout_correction", settings_or_spec)
    if not spec or "is_level" not in spec:
        return None, False
    from rlhf_ext.algorithms import RolloutCorrection

    return RolloutCorrection(
        is_level=spec["is_level"],
        is_threshold=_pair_of(spec["is_threshold"]),
        batch_normalize=bool(spec["batch_normalize"]),
        rejection={option: _pair_of(t) for option, t in spec["rejection"].items()},
    ), bool(spec["bypass"])


# ---- on-policy distillation (the teacher in the reference slot; the loss glue is .distillation) ----

DISTILLATION_KEY = "distillation"
DISTILLATION_FIELDS = ("loss_mode", "use_policy_gradient", "use_task_rewards", "distillation_loss_coef",
                       "log_prob_min_clamp", "loss_max_clamp")  # fmt: skip
DISTILLATION_REFUSED = {
    "topk": "the reference worker computes only the sampled tokens' log-probs, no top-k",
    "teacher_key": "MindSpeed-RL has one reference slot, so one teacher",
}
_DISTILLATION_NOT_WITH = ("rollout_correction", "top_entropy_quantile", "off_policy_mask_threshold")


def check_distillation(value, source: Mapping[str, Any], settings: Mapping[str, Any]) -> Dict[str, Any]:
    """Validate ``rl_config.distillation``; ``{}`` when absent or ``enabled: false``, else
    ``{"distillation": {every DistillationConfig field}}`` (plain values: they pickle with the settings)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"rl_config.distillation must be a mapping like {{loss_mode: k1}}, got {value!r}")
    fields = {str(k): v for k, v in value.items()}
    enabled = fields.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"rl_config.distillation.enabled must be true or false, got {enabled!r}")
    if not enabled:
        return {}
    for key, why in DISTILLATION_REFUSED.items():
        if key in fields:
            raise ConfigError(f"rl_config.distillation.{key} is not supported in MindSpeed-RL: {why}")
    unknown = sorted(set(fields) - set(DISTILLATION_FIELDS))
    if unknown:
        raise ConfigError(f"rl_config.distillation has no key {unknown[0]!r}; "
                          f"valid: {', '.join(DISTILLATION_FIELDS)}, enabled")
    if fields.get("loss_mode") == "forward_kl_topk":
        raise ConfigError("rl_config.distillation.loss_mode=forward_kl_topk is not supported in MindSpeed-RL: "
                          f"{DISTILLATION_REFUSED['topk']}; use k1 (as a reward) or k3 (as a loss)")  # fmt: skip
    from rlhf_ext.algorithms import DistillationConfig

    try:
        config = DistillationConfig(**fields)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"rl_config.distillation: {exc}") from None
    if config.uses_topk:  # a registered top-k loss under another name
        raise ConfigError(
            f"rl_config.distillation.loss_mode={config.loss_mode!r} needs top-k: {DISTILLATION_REFUSED['topk']}")
    kl_coef = source.get("init_kl_coef", 0.01)  # RLConfig 2.1.0's default
    if kl_coef != 0:
        raise ConfigError(
            f"rl_config.distillation: init_kl_coef={kl_coef!r} must be 0: the reference slot holds the teacher, so "
            "the KL-to-reference loss would be a second distillation term and KL-to-initial monitoring is off; "
            "set rl_config.init_kl_coef: 0")
    if source.get("use_kl_in_reward"):
        raise ConfigError("rl_config.distillation cannot be combined with use_kl_in_reward: the reference slot "
                          "holds the teacher, so that KL would be to the teacher, not to the initial policy")
    if source.get("share_backbone"):
        raise ConfigError("rl_config.distillation cannot be combined with share_backbone: the reference then shares "
                          "the actor's weights, so there is no teacher")  # fmt: skip
    if source.get("use_integrated_worker", True):  # RLConfig 2.1.0's default
        integrated = source.get("integrated_mode_config") or {}
        if not (isinstance(integrated, Mapping) and integrated.get("ref_model_load_path")):
            raise ConfigError(
                "rl_config.distillation with the integrated worker needs the teacher's checkpoint in "
                "rl_config.integrated_mode_config.ref_model_load_path (the reference slot); without it the reference "
                "is the initial student")
    for key in _DISTILLATION_NOT_WITH:
        if settings.get(key) is not None:
            name = "rollout_is / rollout_rs" if key == "rollout_correction" else key
            raise ConfigError(f"rl_config.distillation cannot be combined with rl_config.{name} (not supported yet)")
    import dataclasses

    # every field written out: an empty mapping (verl's defaults) must still read as "on" in the loss
    return {DISTILLATION_KEY: dataclasses.asdict(config)}


def extract_and_validate(config_dict: Optional[Mapping]) -> Tuple[Dict, Dict[str, Any]]:
    """Split the rlhf_ext keys off an ``rl_config`` dict and validate every value rlhf_ext extends.

    Returns ``(dict for MindSpeed-RL's own RLConfig, rlhf_ext settings)``; raises :class:`ConfigError`.
    Values not given take RLConfig 2.1.0's defaults for the checks.
    """
    source = dict(config_dict or {})
    correction = check_rollout_correction(source)
    ours = {key: source.pop(key) for key in NEW_KEYS if key in source}
    ours = {k: (_plain(v)) for k, v in ours.items()}
    estimator = source.get("adv_estimator", "group_norm")
    settings: Dict[str, Any] = {}
    options = check_estimator(estimator, ours.get("adv_estimator_options"))
    if options:
        settings["adv_estimator_options"] = options
    loss_type = check_policy_loss(ours.get("policy_loss_type"))
    loss_options = check_policy_loss_options(loss_type, ours.get("policy_loss_options"))
    if loss_options:
        settings["policy_loss_options"] = loss_options
    mode, max_len = check_loss_agg(ours.get("loss_agg_mode"), ours.get("loss_agg_max_len"))
    clip = check_kl(source.get("kl_penalty", "low_var_kl"), ours.get("kl_clip"))
    for key, value in (("policy_loss_type", loss_type), ("loss_agg_mode", mode), ("loss_agg_max_len", max_len)):
        if value is not None:
            settings[key] = value
    if clip is not None:
        settings["kl_clip"] = list(clip) if clip else "none"
    settings.update(check_token_masks(ours, source))
    settings.update(correction)
    settings.update(check_distillation(ours.get("distillation"), source, settings))
    try:
        settings.update(check_adaptive_entropy(ours.get("adaptive_entropy"), source))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    check_verifiers(_plain(source.get("verifier_function", ["base_acc"])), _plain(source.get("verifier_weight", [1.0])))
    return source, settings


def kl_clip_of(settings: Mapping[str, Any]):
    """``None`` (MindSpeed-RL's own clamp), ``"none"`` (no clamp) or ``(lo, hi)``."""
    value = settings.get("kl_clip")
    if value is None or value == "none":
        return value
    return tuple(float(v) for v in value)


def _plain(value):
    """OmegaConf containers (Hydra) -> plain Python values, without importing omegaconf when absent."""
    to_container = getattr(type(value), "__module__", "").startswith("omegaconf")
    if to_container:
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def make_rlconfig_init(original, module):
    """``RLConfig.__init__`` that accepts and validates the plugin's keys (seam: ``rl_config.RLConfig``)."""
    import functools

    @functools.wraps(original)
    def __init__(self, config_dict):
        if config_dict is None:
            return original(self, config_dict)
        rest, settings = extract_and_validate(config_dict)
        original(self, rest)
        for key in NEW_KEYS:
            # Present on every RLConfig so rl_config.dict() (the trainer's **kwargs) always has them.
            setattr(self, key, settings.get(key))
        if settings:
            self.adv_estimator = ConfiguredName(self.adv_estimator, settings)
            self.kl_penalty = ConfiguredName(self.kl_penalty, settings)

    return __init__

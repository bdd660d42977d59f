"""The plugin's flags on ``python -m openrlhf.cli.train_ppo_ray``.

OpenRLHF builds its parser inside ``if __name__ == "__main__":`` and parses strictly, so the
plugin extends the parser at the moment it parses: ``argparse.ArgumentParser.parse_known_args``
is wrapped in the driver process only, and acts only on a parser that has OpenRLHF's PPO options.
It then

* checks the installed OpenRLHF against every patch (a mismatch exits before anything starts);
* widens the choices of ``--algo.advantage.estimator``, ``--actor.policy_loss_type`` and
  ``--actor.loss_agg_mode`` to everything registered in :mod:`rlhf_ext.algorithms`;
* adds the plugin's own flags (group "rlhf_ext plugin" in ``--help``);
* after parsing, validates the combination (a dry run of the chosen estimator and loss on a
  tiny batch turns a bad option into an argparse error), rewrites ``--reward.remote_url
  rlhf_ext:SPEC`` and exports the reward variables before Ray starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Dict

# Only light imports here: the argparse hook is installed at interpreter start-up; rlhf_ext.algorithms
# (torch) loads when OpenRLHF's parser is actually used.
from . import (agents, compat, entropy_control, lora_sync, loss_masks, mismatch, ref_sync, rollout_correction,
               sleep_mode, staleness)
from .config import (
    ADVANTAGE_INPUTS,
    OPENRLHF_ESTIMATORS,
    OPENRLHF_LOSS_AGG_MODES,
    OPENRLHF_POLICY_LOSSES,
    normalize_kl_clip,
    parse_options,
)
from .parser_hook import extended_parse
from .reward_env import resolve_reward_flags

PPO_PARSER_OPTIONS = (
    "--algo.advantage.estimator",
    "--actor.policy_loss_type",
    "--actor.loss_agg_mode",
    "--reward.remote_url",
    "--rollout.n_samples_per_prompt",
)
_EXPECTED_CHOICES = {
    "--algo.advantage.estimator": OPENRLHF_ESTIMATORS,
    "--actor.policy_loss_type": OPENRLHF_POLICY_LOSSES,
    "--actor.loss_agg_mode": OPENRLHF_LOSS_AGG_MODES,
}
PATCH_NAME = "command-line flags"


def is_openrlhf_ppo_parser(parser: argparse.ArgumentParser) -> bool:
    options = getattr(parser, "_option_string_actions", {})
    return all(opt in options for opt in PPO_PARSER_OPTIONS)


def _ns(namespace, dest, default=None):
    return getattr(namespace, dest, default)


def extend_parser(parser: argparse.ArgumentParser) -> None:
    """Check OpenRLHF, then add the plugin's choices and flags to OpenRLHF's PPO parser."""
    from rlhf_ext.algorithms import LOSS_AGG_MODES, available_advantages, available_policy_losses

    compat.verify_all()
    actions = parser._option_string_actions
    for option, expected in _EXPECTED_CHOICES.items():
        got = tuple(actions[option].choices or ())
        if set(got) != set(expected):
            raise compat.OpenRLHFCompatibilityError(
                f"rlhf_ext cannot patch OpenRLHF {compat.openrlhf_version()}: patch '{PATCH_NAME}': {option} offers "
                f"({', '.join(got)}), expected ({', '.join(expected)})"
            )

    # the score-input refusal reads these flags: a rename upstream must not switch it off silently
    for _, flag, _ in LENGTH_PENALTY_FLAGS:
        if flag not in actions:
            raise compat.OpenRLHFCompatibilityError(
                f"rlhf_ext cannot patch OpenRLHF {compat.openrlhf_version()}: patch '{PATCH_NAME}': its parser has no "
                f"{flag}, which the check of --algo.advantage.input score relies on"
            )

    ours = [n for n in available_advantages() if n not in OPENRLHF_ESTIMATORS]
    est = actions["--algo.advantage.estimator"]
    from rlhf_ext.algorithms import available_token_advantages

    # the token-level estimators are choices only to be refused by name with the input OpenRLHF lacks
    est.choices = list(OPENRLHF_ESTIMATORS) + ours + available_token_advantages()
    est.help = (
        f"{est.help} -- with --plugin rlhf_ext also: {', '.join(ours)} (rlhf_ext.algorithms; options via "
        "--algo.advantage.passk_k / --algo.advantage.option)"
    )
    ours_losses = [n for n in available_policy_losses() if n not in OPENRLHF_POLICY_LOSSES]
    loss = actions["--actor.policy_loss_type"]
    loss.choices = list(OPENRLHF_POLICY_LOSSES) + ours_losses
    loss.help = (
        "Policy loss: ppo, gspo (OpenRLHF's own)"
        + (f"; registered with rlhf_ext: {', '.join(ours_losses)}" if ours_losses else "")
    )
    agg = actions["--actor.loss_agg_mode"]
    agg.choices = list(LOSS_AGG_MODES)
    agg.help = (
        "Policy-loss aggregation: token-mean (global token mean, DAPO), seq-mean-token-mean (mean of per-sequence "
        "means, GRPO), seq-mean-token-sum (mean of per-sequence sums), seq-mean-token-sum-norm (sum over tokens / "
        "(max_len x sequences), Dr.GRPO; max_len from --actor.loss_agg_max_len, else --rollout.max_new_tokens, "
        "else --data.max_len), token-sum (sum over tokens, no normaliser, verl's token-sum)"
    )

    from .kl import BIAS_CORRECTED_KL, RLHF_EXT_KL_ESTIMATORS

    kl_est = actions.get("--algo.kl.estimator")
    if kl_est is not None and kl_est.choices:
        added = RLHF_EXT_KL_ESTIMATORS + (BIAS_CORRECTED_KL,)
        kl_est.choices = list(kl_est.choices) + [n for n in added if n not in kl_est.choices]
        kl_est.help = (f"{kl_est.help} -- with --plugin rlhf_ext also: abs (|log pi - log pi_ref|), "
                       f"{BIAS_CORRECTED_KL} ((pi/pi_old) k3, KL as a loss only: --algo.kl.use_loss)")

    group = parser.add_argument_group(
        "rlhf_ext plugin",
        "Flags added by --plugin rlhf_ext (see docs/openrlhf_plugin.md).",
    )
    group.add_argument(
        "--algo.advantage.passk_k", type=int, default=None, metavar="K",
        help="k of the Pass@k advantage (--algo.advantage.estimator passk), 1 <= K <= n_samples_per_prompt",
    )  # fmt: skip
    group.add_argument(
        "--algo.advantage.option", action="append", default=None, metavar="KEY=VALUE",
        help="extra keyword option of a registered estimator, repeatable (e.g. std_scope=batch for grpo)",
    )  # fmt: skip
    group.add_argument(
        "--algo.advantage.input", choices=ADVANTAGE_INPUTS, default="reward",
        help="what a registered estimator groups: the shaped reward (default) or the reward function's 'scores' "
        "(the 0/1 correctness that passk and maxrl need when the reward has extra terms); 'score' refuses "
        "--reward.overlong_buffer_len and --reward.stop_properly_penalty_coef, which change only the rewards",
    )  # fmt: skip
    group.add_argument(
        "--actor.policy_loss_option", action="append", default=None, metavar="KEY=VALUE",
        help="extra keyword option of a registered policy loss, repeatable",
    )  # fmt: skip
    group.add_argument(
        "--actor.loss_agg_max_len", type=int, default=None, metavar="TOKENS",
        help="constant max_len of seq-mean-token-sum-norm (default: --rollout.max_new_tokens, else --data.max_len)",
    )  # fmt: skip
    group.add_argument(
        "--algo.kl.clip", nargs="+", default=None, metavar="BOUND",
        help="clamp per-token KL to [LO, HI] (two numbers) or not at all ('none') in the KL reward and the KL "
        "loss, instead of OpenRLHF's fixed [-10, 10]; the clamped fraction is logged as kl_clip_frac",
    )  # fmt: skip
    group.add_argument(
        "--reward.functions", default=None, metavar="SPEC",
        help="use rlhf_ext's rule reward with SPEC: a preset (math) or weighted terms such as "
        "accuracy:1.0,format:0.2,truncation:-0.5 (same as --reward.remote_url rlhf_ext:SPEC)",
    )  # fmt: skip
    group.add_argument(
        "--reward.grader_timeout", type=float, default=None, metavar="SECONDS",
        help="time limit of one answer check in rlhf_ext's reward (RLHF_EXT_REWARD_TIMEOUT)",
    )  # fmt: skip
    group.add_argument(
        "--reward.grader_workers", type=int, default=None, metavar="N",
        help="parallel grader processes of rlhf_ext's reward in each rollout actor (RLHF_EXT_REWARD_WORKERS)",
    )  # fmt: skip
    mismatch.add_arguments(group)
    loss_masks.add_arguments(group)
    rollout_correction.add_arguments(group)
    staleness.add_arguments(group)
    entropy_control.add_arguments(group)
    ref_sync.add_arguments(group)
    from . import rollout_samples

    rollout_samples.add_arguments(group)
    from . import distill_cli

    distill_cli.add_arguments(group)
    group.add_argument(
        "--rlhf_ext.run_dir", default=None, metavar="DIR",
        help="run record directory: config.json, metrics.jsonl (one line per global step), events.jsonl, "
        "incident.json (default: <--ckpt.path>/rlhf_ext_run; see docs/run_records.md, 'rlhf-ext runs show DIR')",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.run_name", default=None, metavar="NAME",
        help="name of the run in config.json (default: the run directory's name, or --ckpt.path's when defaulted)",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.step_metrics", choices=("all", "off"), default="all",
        help="the per-step metrics rlhf_ext adds to OpenRLHF's: clip_frac_low/high, kl_clip_frac, "
        "zero_variance_group_frac, rlhf_ext/updates_* (all, the default); off: none of them, and the "
        "patched loss, KL and advantage seams do only OpenRLHF's own work (docs/benchmarks.md: what "
        "they cost per step)",
    )  # fmt: skip
    group.add_argument(
        "--rlhf_ext.guard", choices=("stop", "warn", "off"), default="stop",
        help="non-finite guard: loss, policy loss, entropy, advantages, |log-ratio| before each backward and the "
        "gradients before each optimizer step. stop (default): no optimizer step, incident.json, exit code 3; "
        "warn: log and count; off. The real grad norm (NaN when DeepSpeed skipped the step) and DeepSpeed's "
        "skipped-step count are logged in every mode",
    )  # fmt: skip


def _dry_run_estimator(name: str, n: int, options: Dict) -> None:
    import torch

    from rlhf_ext.algorithms import get_advantage, host_inputs

    scores = torch.zeros(1, n)
    scores[0, 0] = 1.0  # binary and, for n > 1, not a zero-variance group
    fn = get_advantage(name)
    stand_ins = {"lengths": torch.ones(1, n), "components": {"accuracy": scores},
                 "turns": [[[(float(s), 0)] for s in scores[0].tolist()]]}
    reserved = sorted(set(options) & set(stand_ins))
    if reserved:
        raise ValueError(f"{', '.join(reserved)} come from the rollouts, not from --algo.advantage.option")
    try:
        fn(scores, **options, **{k: stand_ins[k] for k in host_inputs(fn)})
    except TypeError as exc:
        raise ValueError(f"estimator {name!r} rejects the options {sorted(options)}: {exc}") from None


def _dry_run_loss(name: str, kwargs: Dict) -> None:
    import torch

    from rlhf_ext.algorithms import get_policy_loss

    lp = torch.zeros(1, 2)
    try:
        get_policy_loss(name)(lp, lp.clone(), torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool), **kwargs)
    except TypeError as exc:
        raise ValueError(f"policy loss {name!r} rejects the options {sorted(kwargs)}: {exc}") from None


def finalize(namespace) -> Dict[str, str]:
    """Validate the parsed flags, fill in derived values; returns the environment to export.

    Raises ``ValueError`` with a message naming the flag.
    """
    from rlhf_ext.algorithms import get_policy_loss

    from .policy_loss import flag_options

    estimator = _ns(namespace, "algo.advantage.estimator")
    from rlhf_ext.algorithms import available_token_advantages

    if estimator in available_token_advantages():
        from rlhf_ext.algorithms.token_estimators import host_lacks

        raise ValueError(host_lacks(estimator, "--algo.advantage.estimator", TOKEN_BASELINE_MISSING))
    n = int(_ns(namespace, "rollout.n_samples_per_prompt", 1))
    options = parse_options(_ns(namespace, "algo.advantage.option"), "--algo.advantage.option")
    passk_k = _ns(namespace, "algo.advantage.passk_k")
    if passk_k is not None and estimator != "passk":
        raise ValueError("--algo.advantage.passk_k applies only to --algo.advantage.estimator passk")
    if estimator in OPENRLHF_ESTIMATORS:
        if options:
            raise ValueError(f"--algo.advantage.option applies to rlhf_ext's estimators, not OpenRLHF's {estimator!r}")
        if _ns(namespace, "algo.advantage.input", "reward") != "reward":
            raise ValueError(f"--algo.advantage.input applies to rlhf_ext's estimators, not OpenRLHF's {estimator!r}")
    else:
        _refuse_penalties_on_scores(namespace, estimator)
        if estimator == "passk":
            if passk_k is None and "k" not in options:
                raise ValueError("--algo.advantage.estimator passk needs --algo.advantage.passk_k K")
            if passk_k is not None:
                options["k"] = passk_k
        try:
            _dry_run_estimator(estimator, n, options)
        except ValueError as exc:
            raise ValueError(
                f"--algo.advantage.estimator {estimator} with --rollout.n_samples_per_prompt {n}: {exc}"
            ) from None

    loss_type = _ns(namespace, "actor.policy_loss_type")
    if loss_type == BYPASS_LOSS:
        raise ValueError(BYPASS_LOSS_MISSING)
    loss_options = parse_options(_ns(namespace, "actor.policy_loss_option"), "--actor.policy_loss_option")
    if loss_type in OPENRLHF_POLICY_LOSSES:
        if "delta" in loss_options:
            raise ValueError(f"--actor.policy_loss_option delta: OpenRLHF's own {loss_type!r} has no two-sided clip "
                             "delta (TRL's); for delta >= 1 + the upper clip it is the dual clip, --actor.dual_clip "
                             "DELTA (the same loss, value and gradient; OpenRLHF's ppo has it)")
        if loss_options:
            raise ValueError(f"--actor.policy_loss_option applies to registered losses, not OpenRLHF's {loss_type!r}")
    else:
        from rlhf_ext.algorithms import ratio_cap_refusal

        # --actor.dual_clip is also DPPO's IS-weight cap clip_ratio_c (flag_options): refused only where it is neither
        dual = _ns(namespace, "actor.dual_clip")
        takes_c = "clip_ratio_c" in flag_options(get_policy_loss(loss_type), 0.2, 0.2, 3.0)
        reason = ratio_cap_refusal(loss_type, {"dual_clip": None if takes_c else dual,
                                               "delta": loss_options.get("delta")})
        reason = reason or ratio_cap_refusal(loss_type, {"dual_clip": loss_options.get("dual_clip")})
        if reason:
            raise ValueError(f"--actor.policy_loss_type {loss_type}: {reason}")
        low_high = _ns(namespace, "actor.eps_clip_low_high")
        eps = _ns(namespace, "actor.eps_clip", 0.2)
        kwargs = {**flag_options(get_policy_loss(loss_type), low_high[0] if low_high else eps,
                                 low_high[1] if low_high else eps, _ns(namespace, "actor.dual_clip")), **loss_options}
        try:
            _dry_run_loss(loss_type, kwargs)
        except ValueError as exc:
            raise ValueError(f"--actor.policy_loss_type {loss_type}: {exc}") from None

    mode = _ns(namespace, "actor.loss_agg_mode", "token-mean")
    lora_sync.finalize(namespace)
    agents.finalize(namespace)  # a broken --train.agent_func_path file: one line before Ray starts
    loss_masks.finalize(namespace)
    entropy_control.finalize(namespace)
    ref_sync.finalize(namespace)
    _check_bias_corrected_kl(namespace)
    max_len = _ns(namespace, "actor.loss_agg_max_len")
    if max_len is not None and max_len < 1:
        raise ValueError(f"--actor.loss_agg_max_len must be >= 1, got {max_len}")
    if mode == "seq-mean-token-sum-norm" and max_len is None:
        for dest in ("rollout.max_new_tokens", "data.max_len"):
            if _ns(namespace, dest) is not None:
                setattr(namespace, "actor.loss_agg_max_len", int(_ns(namespace, dest)))
                break

    clip = _ns(namespace, "algo.kl.clip")
    if clip is not None:
        bounds = normalize_kl_clip(clip)
        setattr(namespace, "algo.kl.clip", "none" if bounds is None else list(bounds))

    remote_url, env = resolve_reward_flags(
        _ns(namespace, "reward.remote_url"),
        _ns(namespace, "reward.functions"),
        _ns(namespace, "reward.grader_timeout"),
        _ns(namespace, "reward.grader_workers"),
    )
    setattr(namespace, "reward.remote_url", remote_url)
    from . import distill_cli

    distill_cli.finalize(namespace)  # after the reward flags: use_task_rewards needs a reward
    env.update(rollout_correction.finalize(namespace))  # before mismatch: it may switch the log-probs on
    env.update(staleness.finalize(namespace))  # likewise
    env.update(mismatch.finalize(namespace))
    env.update(sleep_mode.finalize(namespace))  # CPU target: sleep off; NPU: vllm-ascend's allocator setting
    _warn_binary_estimator_on_shaped_reward(estimator, _ns(namespace, "algo.advantage.input", "reward"), env)
    _refuse_components_without_reward(estimator, env)
    return env


BINARY_ESTIMATORS = ("passk", "maxrl")

# rlhf_ext.algorithms.token_estimators (optimal_token_baseline, tir_optimal_token_baseline): choices only to say why
# they cannot run here
TOKEN_BASELINE_MISSING = (
    "OpenRLHF's experience maker has the old log-probs at advantage time, but its actor returns only the sampled "
    "tokens' log-probs, never the full distribution's sum of squares"
)

# rlhf_ext.algorithms.bypass_mode (verl's bypass_mode loss): its old log-probs must be the rollout's
BYPASS_LOSS = "bypass_mode"
BYPASS_LOSS_MISSING = (
    "--actor.policy_loss_type bypass_mode needs the vLLM rollout log-probs in place of the old ones, but OpenRLHF "
    "hands a policy loss the actor's recomputed old log-probs; the same loss is --rlhf_ext.rollout_correction_bypass "
    "with --actor.policy_loss_type ppo (verl's loss_type=ppo_clip; rejection with --rlhf_ext.rollout_rs, no "
    "--rlhf_ext.rollout_is) or pg with --rlhf_ext.rollout_is token (loss_type=reinforce)"
)


def _check_bias_corrected_kl(namespace) -> None:
    from .kl import BIAS_CORRECTED_KL

    if _ns(namespace, "algo.kl.estimator") != BIAS_CORRECTED_KL:
        return
    if not _ns(namespace, "algo.kl.use_loss", False):
        raise ValueError(f"--algo.kl.estimator {BIAS_CORRECTED_KL} weights k3 by pi/pi_old, which exists only in the "
                         "actor's KL loss: add --algo.kl.use_loss (the KL reward has no old log-probs)")
    if _ns(namespace, "algo.kl.unbiased_gradient", False):
        raise ValueError(f"--algo.kl.estimator {BIAS_CORRECTED_KL} already corrects the gradient; drop "
                         "--algo.kl.unbiased_gradient (OpenRLHF's own, different correction)")

# OpenRLHF's length penalties (openrlhf/trainer/ppo_utils/length_penalty.py, apply_length_penalties):
# they rewrite ``experience.rewards`` and never ``experience.scores``.
LENGTH_PENALTY_FLAGS = (
    ("reward.overlong_buffer_len", "--reward.overlong_buffer_len", "DAPO overlong penalty"),
    ("reward.stop_properly_penalty_coef", "--reward.stop_properly_penalty_coef", "ProRL stop-properly penalty"),
)


def _refuse_components_without_reward(estimator, env) -> None:
    """gdpo reads the reward's components, which only rlhf_ext's reward reports (in extra_logs)."""
    if estimator in OPENRLHF_ESTIMATORS or "RLHF_EXT_REWARD" in env:
        return
    from rlhf_ext.algorithms import get_advantage, host_inputs

    if "components" in host_inputs(get_advantage(estimator)):
        raise ValueError(
            f"--algo.advantage.estimator {estimator} normalises each reward component separately and needs "
            "rlhf_ext's reward to report them: add --reward.functions (e.g. accuracy:1.0,format:0.2)"
        )


def _refuse_penalties_on_scores(namespace, estimator) -> None:
    """``--algo.advantage.input score`` with a length penalty: the penalty would be dropped silently.

    The penalties change the rewards; the estimator then reads the reward function's scores, which
    they never touch. Adding them to the scores cannot work either: passk and maxrl need 0/1
    scores, and a penalised score is no longer binary.
    """
    if _ns(namespace, "algo.advantage.input", "reward") != "score":
        return
    used = [(flag, what) for dest, flag, what in LENGTH_PENALTY_FLAGS if _ns(namespace, dest) is not None]
    if not used:
        return
    flags = " and ".join(f"{flag} ({what})" for flag, what in used)
    raise ValueError(
        f"--algo.advantage.input score cannot be combined with {flags}: OpenRLHF applies length penalties to the "
        f"rewards, but with --algo.advantage.input score the {estimator} estimator reads the reward function's 0/1 "
        "scores, so the penalty would be silently ignored (and a penalised score is no longer the binary "
        "correctness that passk and maxrl need). Drop the penalty flag, or use --algo.advantage.input reward "
        "with an estimator that accepts shaped rewards (e.g. grpo, dr_grpo)"
    )


def _warn_binary_estimator_on_shaped_reward(estimator, source, env) -> None:
    """passk / maxrl on rlhf_ext's shaped reward would fail at the first batch: say so at start-up."""
    spec = env.get("RLHF_EXT_REWARD")
    if estimator not in BINARY_ESTIMATORS or source != "reward" or spec is None:
        return
    if spec.replace(" ", "") in ("accuracy", "accuracy:1", "accuracy:1.0"):
        return
    sys.stderr.write(
        f"rlhf_ext: warning: --algo.advantage.estimator {estimator} needs 0/1 rewards, but the reward '{spec}' "
        "adds shaping terms; add --algo.advantage.input score to use the correctness scores\n"
    )


def summary(namespace) -> str:
    estimator = _ns(namespace, "algo.advantage.estimator")
    loss_type = _ns(namespace, "actor.policy_loss_type")
    mode = _ns(namespace, "actor.loss_agg_mode")
    parts = [
        f"estimator={estimator} ({'OpenRLHF' if estimator in OPENRLHF_ESTIMATORS else 'rlhf_ext'})",
        f"policy_loss={loss_type} ({'OpenRLHF' if loss_type in OPENRLHF_POLICY_LOSSES else 'rlhf_ext'})",
        f"loss_agg_mode={mode}"
        + (f" (max_len={_ns(namespace, 'actor.loss_agg_max_len')})" if mode == "seq-mean-token-sum-norm" else ""),
        f"kl_clip={_ns(namespace, 'algo.kl.clip') or 'OpenRLHF default [-10, 10]'}",
    ]
    if loss_masks.summary(namespace):
        parts.append(loss_masks.summary(namespace))
    from .distill_cli import summary as distill_summary

    if distill_summary(namespace):
        parts.append(distill_summary(namespace))
    if staleness.summary(namespace):
        parts.append(staleness.summary(namespace))
    return "rlhf_ext: " + ", ".join(parts)


_lock = threading.Lock()
_original_parse_known_args = None


def install_argparse_hook() -> None:
    """Wrap ``ArgumentParser.parse_known_args`` once (driver process only)."""
    global _original_parse_known_args
    with _lock:
        if _original_parse_known_args is not None:
            return
        original = argparse.ArgumentParser.parse_known_args
        _original_parse_known_args = original

        def parse_known_args(self, args=None, namespace=None):
            if getattr(self, "_rlhf_ext_extended", False):
                return original(self, args, namespace)
            if not is_openrlhf_ppo_parser(self):
                from .dpo_cli import is_openrlhf_dpo_parser, parse_with_plugin

                if not is_openrlhf_dpo_parser(self):
                    return original(self, args, namespace)
                self._rlhf_ext_extended = True
                return parse_with_plugin(self, original, args, namespace)
            self._rlhf_ext_extended = True
            parsed, extras, env = extended_parse(self, original, args, namespace, extend=extend_parser,
                                                 finalize=finalize)
            os.environ.update(env)  # before train() calls ray.init: rollout actors inherit it
            sys.stderr.write(summary(parsed) + "\n")
            from .node_check import prepare as prepare_node_check
            from .run_record import prepare_driver_record

            prepare_node_check(parsed, prepare_driver_record(parsed))
            return parsed, extras

        parse_known_args.__rlhf_ext_patch__ = PATCH_NAME
        argparse.ArgumentParser.parse_known_args = parse_known_args


def uninstall_argparse_hook() -> None:
    global _original_parse_known_args
    with _lock:
        if _original_parse_known_args is not None:
            argparse.ArgumentParser.parse_known_args = _original_parse_known_args
            _original_parse_known_args = None

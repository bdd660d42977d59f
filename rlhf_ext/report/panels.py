"""The training-dynamics panels of the report: which metric keys each one draws, and what to say
when no run logged them.

Each panel lists, per line style, candidate keys in order of preference (OpenRLHF's name first,
then equivalents written by other versions or by ``rlhf-ext runs export``); a run uses the first
candidate it has. Keys follow the run record format (``train/``, ``rollout/``, ``timing/``,
``rollout_mismatch/``, ``rollout_corr/`` prefixes; docs/run_records.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .loaded_runs import RunRecord


@dataclass(frozen=True)
class Panel:
    id: str
    title: str
    y_title: str
    lines: Tuple[Tuple[str, ...], ...]
    """One tuple of candidate keys per line style (e.g. clip fraction low, high)."""
    line_labels: Tuple[str, ...] = ("",)
    missing: str = ""
    """Why a run may not have it / how to get it; shown when no run logged the panel's keys."""
    limit: Optional[Callable[[RunRecord], Optional[Tuple[float, str]]]] = None
    """A horizontal reference line per run (value, label), e.g. the generation length limit."""
    fallback: Optional["Panel"] = None
    """Drawn instead when no run has any of :attr:`lines` (with a note saying so)."""
    y_scale: str = ""
    """``"share"``: a share of samples or groups, drawn on [0, 1] (when every value lies there);
    ``"nonnegative"``: never below 0 (small token fractions, weights), the top fitted to the data;
    ``""``: plotly's autorange."""
    only_if_logged: bool = False
    """Left out of the page when no run logged it (a mode-specific panel, e.g. distillation), instead of a
    "not logged" box."""


def _generation_limit(run: RunRecord) -> Optional[Tuple[float, str]]:
    for key in ("rollout.generate_max_len", "rollout.max_new_tokens", "generate_max_len"):
        value = run.args.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), f"generation limit {value:g} ({run.name})"
    return None


def _mismatch_threshold(run: RunRecord) -> Optional[Tuple[float, str]]:
    plugin = run.config.get("plugin") or {}
    for key in ("mismatch_threshold", "mismatch_probs_diff_threshold"):
        value = plugin.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value), f"warning threshold {value:g}"
    return None


PASS_RATE_KEYS = ("train/score", "train/reward/accuracy")

PANELS: Tuple[Panel, ...] = (
    Panel("pass_rate", "Batch pass rate", "fraction correct", (PASS_RATE_KEYS,), y_scale="share",
          missing="OpenRLHF logs train/score when the reward function returns a score "
                  "(rlhf_ext:math does: 1 for a correct answer)."),
    Panel("reward", "Reward", "mean reward", (("train/reward", "rollout/reward_mean"),)),
    Panel("response_length", "Response length", "tokens", (("train/response_length", "rollout/response_length_mean"),),
          limit=_generation_limit),
    Panel("truncation", "Truncated responses", "fraction", (("rollout/truncated_rate", "train/truncated"),),
          y_scale="share"),
    Panel("entropy", "Entropy", "entropy", (("train/entropy", "train/entropy_loss"),),
          missing="OpenRLHF computes the policy entropy only with --actor.entropy_coef set."),
    Panel("grad_norm", "Gradient norm", "actor grad norm", (("train/actor_grad_norm", "train/grad_norm"),)),
    Panel("policy_loss", "Policy loss", "loss", (("train/policy_loss",),)),
    Panel("clip", "Clip fractions", "fraction of tokens", (("train/clip_frac_low",), ("train/clip_frac_high",)),
          line_labels=("low", "high"), y_scale="nonnegative",
          missing="The low/high split is logged by rlhf_ext's policy losses (--plugin rlhf_ext).",
          fallback=Panel("clip_ratio", "PPO clip ratio (both sides)", "fraction of tokens",
                         (("train/ppo_clip_ratio",),), y_scale="nonnegative")),
    Panel("kl", "KL to the reference", "KL", (("train/kl",),),
          missing="OpenRLHF logs train/kl when a reference model is used (--algo.kl.init_coef > 0 or --algo.kl.use_loss)."),
    Panel("mismatch", "Rollout vs training mismatch", "mean |p_train - p_rollout|",
          (("rollout_mismatch/probs_diff_mean",),), limit=_mismatch_threshold,
          missing="Logged with --rlhf_ext.mismatch_metrics (docs/run_records.md)."),
    Panel("rollout_correction", "Rollout correction", "weight / fraction",
          (("rollout_corr/weight_mean",), ("rollout_corr/ess",), ("rollout_corr/rejected_fraction",),
           ("rollout_corr/is_truncated_fraction",)),
          line_labels=("mean weight", "ESS", "rejected", "truncated"), y_scale="nonnegative",
          missing="Logged with --rlhf_ext.rollout_is / --rlhf_ext.rollout_rs, or OpenRLHF's "
                  "--algo.advantage.is_correction_level with an rlhf_ext loss (docs/rollout_correction.md)."),
    Panel("step_time", "Time per step", "seconds", (("timing/step_total",),)),
    Panel("policy_lag", "Policy lag (async rollouts)", "training steps behind",
          (("rlhf_ext/policy_lag",), ("rlhf_ext/policy_lag_max",)), line_labels=("mean", "max"),
          missing="Logged with --train.async_enable: the trainer's policy version minus the version that "
                  "generated the step's rollouts (0 by construction in synchronous runs; docs/run_records.md)."),
    Panel("distillation", "Distillation", "per token",
          (("train/distill/loss",), ("train/distill/reverse_kl_k1",), ("train/distill/reverse_kl_k3",)),
          line_labels=("distillation loss", "reverse KL to the teacher (k1)", "reverse KL to the teacher (k3)"),
          only_if_logged=True,
          missing="Logged with --rlhf_ext.teacher (on-policy distillation, docs/distillation.md)."),
    Panel("distillation_topk", "Distillation: teacher top-k", "mass / fraction",
          (("train/distill/student_topk_mass",), ("train/distill/teacher_topk_mass",), ("train/distill/topk_overlap",)),
          line_labels=("student top-k mass", "teacher top-k mass", "top-k overlap"), y_scale="share",
          only_if_logged=True,
          missing="Logged with --rlhf_ext.teacher and --rlhf_ext.distill.loss_mode forward_kl_topk."),
    # Mechanism panels: the evidence a claim about why a recipe works cites.
    Panel("zero_variance", "Zero-variance prompt groups (no gradient signal)", "fraction of groups",
          (("rlhf_ext/zero_variance_group_frac_before_filter", "train/zero_variance_group_frac"),), y_scale="share",
          missing="Logged by --plugin rlhf_ext for every estimator (--rlhf_ext.step_metrics all, the default); "
                  "before dynamic filtering as rlhf_ext/zero_variance_group_frac_before_filter."),
    Panel("advantage_std", "Advantage std", "std over response tokens", (("train/advantage_std",),),
          missing="Logged by --plugin rlhf_ext for every estimator, OpenRLHF's built-in ones included "
                  "(--rlhf_ext.step_metrics all, the default)."),
    Panel("ppo_kl", "PPO KL to the rollout policy", "mean log pi_old - log pi", (("train/ppo_kl",),),
          missing="OpenRLHF logs train/ppo_kl in every PPO step."),
    Panel("rollout_corr", "Rollout vs training correlation", "(1 - corr) x 1e4",
          (("rollout_mismatch/probs_corr_loss_1e4",),),
          missing="Logged with --rlhf_ext.mismatch_metrics (docs/run_records.md)."),
)

TIMING_TOTAL = "timing/step_total"


@dataclass
class PanelData:
    """What a panel draws: per run, per line style, the key used (None when the run lacks it)."""

    panel: Panel
    keys: Dict[int, List[Optional[str]]] = field(default_factory=dict)
    missing_runs: List[str] = field(default_factory=list)
    note: str = ""

    @property
    def empty(self) -> bool:
        return not any(k for keys in self.keys.values() for k in keys)


def resolve(panel: Panel, runs: Sequence[RunRecord]) -> PanelData:
    """Pick each run's key for each line style; fall back to :attr:`Panel.fallback` when no run
    has any; note the runs that lack the panel."""
    data = PanelData(panel=panel)
    empty_runs = []
    for i, run in enumerate(runs):
        chosen = [next((k for k in candidates if run.has(k)), None) for candidates in panel.lines]
        if any(chosen):
            data.keys[i] = chosen
        elif not len(run.steps):
            empty_runs.append(run.name)  # nothing logged yet: not a missing metric
        else:
            data.missing_runs.append(run.name)
    if data.empty and panel.fallback is not None:
        fallback = resolve(panel.fallback, runs)
        if not fallback.empty:
            wanted = ", ".join(c[0] for c in panel.lines)
            fallback.note = f"No run logged {wanted}; showing {panel.fallback.lines[0][0]} instead. {panel.missing}"
            return fallback
    notes = []
    if data.empty and data.missing_runs:
        wanted = " / ".join(c for cands in panel.lines for c in cands)
        notes.append(f"No run logged {wanted}. {panel.missing}".strip())
    elif data.missing_runs:
        notes.append(f"Not logged by {', '.join(data.missing_runs)}.")
    if empty_runs:
        notes.append(f"No step recorded yet by {', '.join(empty_runs)}.")
    data.note = " ".join(notes)
    return data


def timing_phases(runs: Sequence[RunRecord]) -> List[str]:
    """The ``timing/*`` keys any run logged, except the per-step total, in a stable order."""
    keys = sorted({k for run in runs for k in run.metrics if k.startswith("timing/") and k != TIMING_TOTAL
                   and run.has(k)})
    return keys

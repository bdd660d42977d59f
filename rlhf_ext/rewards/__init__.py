"""Reward functions (Open-R1 rule rewards) and a math grader safe to run inside a training job.

Grading::

    from rlhf_ext.rewards import MathGrader, extract_answer

    with MathGrader(timeout=5.0) as grader:                 # worker pool starts on first use
        r = grader.grade("... so the answer is \\boxed{\\frac{1}{2}}", "0.5")
        r.correct, r.extracted                              # True, "1/2"
        results = grader.grade_batch(responses, golds)      # parallel, input order

Rewards, by name or as a weighted combination::

    from rlhf_ext.rewards import WeightedReward, get_reward

    reward = WeightedReward("accuracy:1.0,format:0.2,truncation:-0.5")   # or the preset "math"
    out = reward(completions, solutions, truncated=[False, True])
    out.rewards, out.correct, out.components["format"], out.flags["timeout"]

OpenRLHF: ``--reward.remote_url "$(python -m rlhf_ext.rewards.path)"`` (configured by the
``RLHF_EXT_REWARD*`` variables, see :mod:`.config`), or ``rlhf-ext reward-server`` for remote
rollout actors. verl: ``reward.custom_reward_function.path=$(python -m rlhf_ext.rewards.path --verl)``
with ``name=compute_score`` (:mod:`.verl_reward`, docs/verl.md). Third-party rewards register with ``@register_reward`` or the ``rlhf_ext.rewards``
entry point group. docs/rewards.md has the details.

Importing this package does not import torch or start any process. An OpenRLHF agent's ``step`` takes
the same rewards with ``agent_reward("rlhf_ext:math")`` (:mod:`.agent`).
"""

from .extraction import (AnswerCandidate, extract_answer, find_answer_candidate, find_final_boxes, find_last_expression,
                         latex_for_math_verify, normalize_answer, prepare_gold)
from .grader import GradeResult, MathGrader, cgroup_cpu_limit, default_grader, default_workers
from .exact_numbers import exact_verdict
from .registry import (
    ENTRY_POINT_GROUP,
    UnknownRewardError,
    available_rewards,
    get_reward,
    register_reward,
)
from .rule_rewards import (
    accuracy_reward,
    answer_format_reward,
    completion_texts,
    cosine_scaled_reward,
    format_reward,
    length_reward,
    reasoning_steps_reward,
    repetition_penalty_reward,
    soft_overlong_punishment_reward,
    tag_count_reward,
    truncation_reward,
)
from .choice import (ANSWER_TYPES, ChoiceGrade, GoldFormatError, Options, StructuredGold, extract_choice,
                     extract_ranking, grade_structured, kendall_tau, parse_options, parse_structured_gold,
                     ranking_partial_score)
from .choice_rewards import (choice_accuracy_reward, grade_mixed, parse_failure_reward, ranking_exact_reward,
                             ranking_partial_reward)
from .composite import REWARD_PRESETS, RewardBreakdown, WeightedReward, parse_reward_spec
from .config import RewardConfig, reward_config_from_env
from .openrlhf_protocol import RewardScorer, recover_response
from .verifier_cascade import (Candidate, CascadeStats, VerifierCascade, VerifierSettings, VerifierVerdict,
                               cascade_correct, parse_verdict, verify_grades)


def __getattr__(name):
    # Loaded on first use, so that `python -m rlhf_ext.rewards.path` runs without runpy's
    # "found in sys.modules" warning.
    if name in ("reward_file_path", "verl_reward_file_path", "resolve_remote_url"):
        from . import reward_file

        return getattr(reward_file, name)
    if name in ("agent_reward", "AgentReward"):  # an OpenRLHF agent's step reward (imports torch when called)
        from . import agent

        return getattr(agent, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "MathGrader",
    "GradeResult",
    "default_grader",
    "default_workers",
    "cgroup_cpu_limit",
    "extract_answer",
    "find_answer_candidate",
    "find_final_boxes",
    "find_last_expression",
    "normalize_answer",
    "latex_for_math_verify",
    "prepare_gold",
    "exact_verdict",
    "AnswerCandidate",
    "ENTRY_POINT_GROUP",
    "UnknownRewardError",
    "available_rewards",
    "get_reward",
    "register_reward",
    "accuracy_reward",
    "format_reward",
    "tag_count_reward",
    "reasoning_steps_reward",
    "length_reward",
    "cosine_scaled_reward",
    "repetition_penalty_reward",
    "soft_overlong_punishment_reward",
    "truncation_reward",
    "answer_format_reward",
    "completion_texts",
    "ANSWER_TYPES",
    "ChoiceGrade",
    "GoldFormatError",
    "Options",
    "StructuredGold",
    "extract_choice",
    "extract_ranking",
    "grade_structured",
    "grade_mixed",
    "kendall_tau",
    "parse_options",
    "parse_structured_gold",
    "ranking_partial_score",
    "choice_accuracy_reward",
    "ranking_exact_reward",
    "ranking_partial_reward",
    "parse_failure_reward",
    "REWARD_PRESETS",
    "RewardBreakdown",
    "WeightedReward",
    "parse_reward_spec",
    "RewardConfig",
    "reward_config_from_env",
    "RewardScorer",
    "recover_response",
    "VerifierSettings",
    "VerifierCascade",
    "VerifierVerdict",
    "CascadeStats",
    "Candidate",
    "cascade_correct",
    "parse_verdict",
    "verify_grades",
    "reward_file_path",
    "verl_reward_file_path",
    "resolve_remote_url",
    "agent_reward",
    "AgentReward",
]

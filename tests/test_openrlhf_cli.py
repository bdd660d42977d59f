"""``python -m openrlhf.cli.train_ppo_ray --plugin rlhf_ext``: help, choices, flag validation, reward mapping.

Three runs are real subprocesses of the unmodified OpenRLHF CLI (what users type); the flag
combinations run OpenRLHF's real ``__main__`` block in this process (runpy) with the argparse hook
installed, stopped right after parsing by a spy on ``openrlhf.utils.config.hierarchize``.
"""

import os
import subprocess
import sys

import pytest

from rlhf_ext.algorithms import register_policy_loss
from rlhf_ext.algorithms.registry import POLICY_LOSSES

CLI = [sys.executable, "-m", "openrlhf.cli.train_ppo_ray"]
NEW_ESTIMATORS = ["grpo", "maxrl", "passk", "reinforce_pp", "reinforce_pp_baseline", "gpg", "opo", "passk_best", "gdpo"]


def _env():
    return {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """The two slow CLI subprocesses, started together (each imports OpenRLHF)."""
    cwd = tmp_path_factory.mktemp("cli")
    procs = {
        "help": subprocess.Popen(CLI + ["--plugin", "rlhf_ext", "--help"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd),
        "bad_estimator": subprocess.Popen(CLI + ["--plugin=rlhf_ext", "--algo.advantage.estimator", "grpoo"],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=cwd),
    }  # fmt: skip
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        results[name] = (proc.returncode, out, err)
    return results


def test_help_lists_new_choices_and_flags(cli_runs):
    rc, out, err = cli_runs["help"]
    assert rc == 0, err
    choices = out.split("--algo.advantage.estimator {", 1)[1].split("}", 1)[0].split(",")
    assert choices[:7] == ["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce"]
    assert set(NEW_ESTIMATORS) <= set(choices)
    assert "{token-mean,seq-mean-token-mean,seq-mean-token-sum,seq-mean-token-sum-norm,token-sum}" in out
    for flag in ("--algo.advantage.passk_k", "--algo.kl.clip", "--reward.functions", "--reward.grader_timeout",
                 "--reward.grader_workers", "--actor.loss_agg_max_len", "--algo.advantage.option"):  # fmt: skip
        assert flag in out
    assert "rlhf_ext plugin:" in out and "Dr.GRPO" in out
    assert "role=driver" in err


def test_bad_estimator_gets_argparse_error_with_valid_names(cli_runs):
    rc, out, err = cli_runs["bad_estimator"]
    assert rc == 2
    assert "argument --algo.advantage.estimator: invalid choice: 'grpoo'" in err
    assert "'passk'" in err and "'gae'" in err


def test_bad_plugin_name_fails_before_openrlhf_loads():
    out = subprocess.run(CLI + ["--plugin", "rlhf-ext", "--help"], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 2
    assert "rlhf_ext: error: unknown plugin 'rlhf-ext'; available plugins: rlhf_ext" in out.stderr
    assert out.stdout == ""


def test_dr_grpo_complete_recipe(parse, capfd):
    args = parse("--algo.advantage.estimator", "dr_grpo", "--actor.loss_agg_mode", "seq-mean-token-sum-norm",
                 "--rollout.max_new_tokens", "1024", "--rollout.n_samples_per_prompt", "8")  # fmt: skip
    assert args.actor.loss_agg_mode == "seq-mean-token-sum-norm"
    assert args.actor.loss_agg_max_len == 1024  # Dr.GRPO's constant: the generation budget
    assert "loss_agg_mode=seq-mean-token-sum-norm (max_len=1024)" in capfd.readouterr().err


def test_passk_options_and_kl_clip(parse):
    args = parse("--algo.advantage.estimator", "passk", "--algo.advantage.passk_k", "4",
                 "--rollout.n_samples_per_prompt", "8", "--algo.kl.clip", "-5", "5")  # fmt: skip
    assert args.algo.advantage.estimator == "passk" and args.algo.advantage.passk_k == 4
    assert args.algo.kl.clip == [-5.0, 5.0]
    args = parse("--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "4", "--algo.kl.clip", "none",
                 "--algo.advantage.option", "std_scope=batch")  # fmt: skip
    assert args.algo.kl.clip == "none" and args.algo.advantage.option == ["std_scope=batch"]


def test_openrlhf_defaults_untouched(parse):
    args = parse("--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4")
    assert args.algo.kl.clip is None and args.actor.loss_agg_mode == "token-mean" and args.reward.remote_url is None


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--algo.advantage.estimator", "passk", "--rollout.n_samples_per_prompt", "4"], "needs --algo.advantage.passk_k"),
        (["--algo.advantage.estimator", "passk", "--rollout.n_samples_per_prompt", "4", "--algo.advantage.passk_k", "8"],
         "k=8 is larger than the group size N=4"),
        (["--algo.advantage.estimator", "grpo"], "needs at least 2 samples per prompt"),
        (["--algo.advantage.estimator", "grpo", "--rollout.n_samples_per_prompt", "4", "--algo.advantage.option", "k=3"],
         "rejects the options ['k']"),
        (["--algo.advantage.estimator", "group_norm", "--algo.advantage.passk_k", "2"], "passk_k applies only"),
        (["--algo.kl.clip", "3", "1"], "LO < HI"),
        (["--algo.kl.clip", "1"], "LO HI or 'none'"),
        (["--actor.loss_agg_mode", "seq-sum"], "invalid choice: 'seq-sum'"),
        (["--rlhf_ext.top_entropy_quantile", "0.2"], "add --actor.entropy_coef 0"),
        (["--algo.advantage.estimator", "optimal_token_baseline", "--rollout.n_samples_per_prompt", "4"],
         "its actor returns only the sampled tokens' log-probs"),
        (["--algo.advantage.estimator", "tir_optimal_token_baseline", "--rollout.n_samples_per_prompt", "4"],
         "tir_optimal_token_baseline is a token-level estimator: it needs, per response token, sum_pi_squared"),
        (["--rlhf_ext.top_entropy_quantile", "1.5", "--actor.entropy_coef", "0"], "must be in (0, 1]"),
        (["--rlhf_ext.off_policy_mask_threshold", "-1"], "must be a finite number >= 0"),
        (["--algo.kl.estimator", "k3_bias_corrected"], "add --algo.kl.use_loss"),
        (["--algo.kl.estimator", "k3_bias_corrected", "--algo.kl.use_loss", "--algo.kl.unbiased_gradient"],
         "drop --algo.kl.unbiased_gradient"),
        (["--algo.advantage.estimator", "gdpo", "--rollout.n_samples_per_prompt", "4"],
         "needs rlhf_ext's reward to report them: add --reward.functions"),
        (["--algo.advantage.estimator", "opo", "--rollout.n_samples_per_prompt", "4", "--algo.advantage.option",
          "lengths=3"], "lengths come from the rollouts"),
        (["--actor.policy_loss_option", "x=1"], "applies to registered losses"),
        (["--reward.remote_url", "rlhf_ext:accuracy:1.0,nosuch:1"], "unknown reward 'nosuch'"),
        (["--reward.grader_workers", "2"], "configure rlhf_ext's reward file"),
    ],
)
def test_bad_combinations_are_argparse_errors(parse, capfd, argv, message):
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert message in capfd.readouterr().err


def test_new_estimators_and_token_sum_pass_validation(parse):
    args = parse("--algo.advantage.estimator", "opo", "--rollout.n_samples_per_prompt", "4")
    assert args.algo.advantage.estimator == "opo"  # the dry run gave opo stand-in lengths
    args = parse("--algo.advantage.estimator", "gpg", "--rollout.n_samples_per_prompt", "4",
                 "--algo.advantage.option", "alpha_count=nonzero_reward", "--actor.policy_loss_type", "pg",
                 "--actor.loss_agg_mode", "token-sum")
    assert args.actor.loss_agg_mode == "token-sum"
    args = parse("--algo.advantage.estimator", "gdpo", "--rollout.n_samples_per_prompt", "4",
                 "--reward.functions", "accuracy:1.0,format:0.2")
    assert args.algo.advantage.estimator == "gdpo"
    args = parse("--algo.kl.estimator", "abs")
    assert args.algo.kl.estimator == "abs"


def test_token_sum_with_openrlhfs_losses_and_the_loss_mask_flags_pass_validation(parse):
    for loss in ("ppo", "gspo"):
        args = parse("--actor.policy_loss_type", loss, "--actor.loss_agg_mode", "token-sum")
        assert args.actor.loss_agg_mode == "token-sum"
    args = parse("--rlhf_ext.top_entropy_quantile", "0.2", "--actor.entropy_coef", "0",
                 "--rlhf_ext.mask_truncated_completions", "--rlhf_ext.off_policy_mask_threshold", "0.5",
                 "--algo.kl.estimator", "k3_bias_corrected", "--algo.kl.use_loss")
    assert args.rlhf_ext.top_entropy_quantile == 0.2 and args.rlhf_ext.mask_truncated_completions
    assert args.rlhf_ext.off_policy_mask_threshold == 0.5 and args.algo.kl.estimator == "k3_bias_corrected"


def test_registered_policy_loss_is_a_choice(parse, capfd):
    register_policy_loss("test_cli_loss")(lambda lp, old, adv, mask, eps_low=0.2, eps_high=0.2: (lp * 0, {}))
    try:
        args = parse("--actor.policy_loss_type", "test_cli_loss")
        assert args.actor.policy_loss_type == "test_cli_loss"
        args = parse("--actor.policy_loss_type", "test_cli_loss", "--algo.advantage.is_correction_level", "token")
        assert args.algo.advantage.is_correction_level == "token"  # same meaning as for OpenRLHF's own losses
    finally:
        POLICY_LOSSES.unregister("test_cli_loss")


def test_reward_shortcut_sets_file_and_environment(parse):
    from rlhf_ext.rewards.path import reward_file_path

    args = parse("--reward.remote_url", "rlhf_ext:accuracy:1.0,format:0.2", "--reward.grader_timeout", "3",
                 "--reward.grader_workers", "2")  # fmt: skip
    assert args.reward.remote_url == reward_file_path()  # a path: OpenRLHF's later split on "," keeps it whole
    assert os.environ["RLHF_EXT_REWARD"] == "accuracy:1.0,format:0.2"
    assert os.environ["RLHF_EXT_REWARD_TIMEOUT"] == "3.0" and os.environ["RLHF_EXT_REWARD_WORKERS"] == "2"


EXAMPLES = {
    "dr_grpo.sh": ("dr_grpo", "ppo", "seq-mean-token-sum-norm"),
    "passk.sh": ("passk", "ppo", "token-mean"),
    "gspo.sh": ("grpo", "gspo", "seq-mean-token-mean"),
    "reinforce_pp_baseline.sh": ("reinforce_pp_baseline", "ppo", "token-mean"),
    "maxrl.sh": ("maxrl", "ppo", "token-mean"),
    "async_staleness.sh": ("grpo", "ppo", "token-mean"),
}


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_recipes_pass_openrlhf_and_plugin_validation(parse, script):
    """The GPU example scripts cannot train here, but every flag they pass is parsed and validated."""
    from pathlib import Path

    from rlhf_ext.rewards.path import reward_file_path

    folder = Path(__file__).resolve().parents[1] / "examples" / "openrlhf"
    env = dict(os.environ, RLHF_EXT_PRINT_ARGS="1", RUN_NAME="same")

    def printed(cmd):
        out = subprocess.run(cmd, capture_output=True, env=env, timeout=60, check=True)
        return out.stdout.decode().split("\0")[:-1]

    argv = printed(["bash", str(folder / script)])
    placement = "split" if script == "async_staleness.sh" else "colocated"
    recipe = printed(["bash", "-c", f"PLACEMENT={placement}; source {folder / 'recipe.sh'}; run_recipe"])
    assert argv[: len(recipe)] == recipe  # the same recipe; only the algorithm switch follows
    assert argv[:2] == ["--plugin", "rlhf_ext"]  # consumed by the start-up hook in a real run
    args = parse(*argv[2:], full=True)
    estimator, loss, mode = EXAMPLES[script]
    assert (args.algo.advantage.estimator, args.actor.policy_loss_type, args.actor.loss_agg_mode) == (estimator, loss, mode)
    assert args.reward.remote_url == [reward_file_path()]  # after OpenRLHF's own split
    assert os.environ["RLHF_EXT_REWARD"] == "math"
    if script == "dr_grpo.sh":
        assert args.actor.loss_agg_max_len == args.rollout.max_new_tokens == 2048
    if script == "async_staleness.sh":
        assert args.train.async_enable and not args.vllm.enable_sleep and not args.train.colocate_all
        assert args.rlhf_ext.decoupled_loss and args.rlhf_ext.m2po_threshold == 0.04 and args.rlhf_ext.adaptive_entropy
        assert args.actor.num_gpus_per_node == args.vllm.num_engines == 4


def test_the_recipe_names_a_wrong_placement(tmp_path):
    from pathlib import Path

    folder = Path(__file__).resolve().parents[1] / "examples" / "openrlhf"
    proc = subprocess.run(["bash", "-c", f"PLACEMENT=spread; source {folder / 'recipe.sh'}; run_recipe"],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, RLHF_EXT_PRINT_ARGS="1"))
    assert proc.returncode == 2 and "PLACEMENT must be colocated or split, got 'spread'" in proc.stderr


def test_binary_estimator_on_shaped_reward_warns(parse, capfd):
    parse("--algo.advantage.estimator", "maxrl", "--rollout.n_samples_per_prompt", "4", "--reward.functions", "math")
    assert "needs 0/1 rewards" in capfd.readouterr().err
    parse("--algo.advantage.estimator", "maxrl", "--rollout.n_samples_per_prompt", "4", "--reward.functions", "math",
          "--algo.advantage.input", "score")  # fmt: skip
    assert "needs 0/1 rewards" not in capfd.readouterr().err


def test_new_losses_take_the_clip_flags_and_their_options(parse, capfd):
    args = parse("--actor.policy_loss_type", "sapo", "--actor.policy_loss_option", "tau_neg=2.0")
    assert args.actor.policy_loss_type == "sapo"
    with pytest.raises(SystemExit):
        parse("--actor.policy_loss_type", "sapo", "--actor.policy_loss_option", "tau_neg=0")
    assert "--actor.policy_loss_type sapo: sapo: tau_neg must be a finite number > 0" in capfd.readouterr().err
    with pytest.raises(SystemExit):  # --actor.eps_clip_low_high is DPPO's trust region: 0 is no region
        parse("--actor.policy_loss_type", "dppo_tv", "--actor.eps_clip_low_high", "0", "0.2")
    assert "dppo_tv: clip_ratio_low must be a finite number > 0" in capfd.readouterr().err
    with pytest.raises(SystemExit):
        parse("--actor.policy_loss_type", "vespo", "--actor.policy_loss_option", "k_pos=1")
    assert "rejects the options ['k_pos']" in capfd.readouterr().err
    # issue 42: dro takes verl's dro_beta; bypass_mode needs the rollout log-probs as its old ones
    assert parse("--actor.policy_loss_type", "dro", "--actor.policy_loss_option", "dro_beta=0.2").actor.policy_loss_type == "dro"
    with pytest.raises(SystemExit):
        parse("--actor.policy_loss_type", "dro", "--actor.policy_loss_option", "dro_beta=-1")
    assert "dro_beta must be a finite number > 0" in capfd.readouterr().err
    with pytest.raises(SystemExit):
        parse("--actor.policy_loss_type", "bypass_mode")
    assert "--rlhf_ext.rollout_correction_bypass with --actor.policy_loss_type ppo" in capfd.readouterr().err

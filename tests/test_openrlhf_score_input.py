"""Issue 17, item 7: ``--algo.advantage.input score`` with an OpenRLHF length penalty is refused.

The penalties change ``rewards``; with ``input score`` the estimator reads ``scores``, so they
would be dropped without a word. The flags run through OpenRLHF's real parser (its CLI module run
in this process with the plugin's argparse hook, stopped right after parsing).
"""

import pytest

PENALTIES = {
    "overlong": ["--reward.overlong_buffer_len", "512"],
    "stop_properly": ["--reward.stop_properly_penalty_coef", "0.0"],
    "stop_properly_negative": ["--reward.stop_properly_penalty_coef", "-1"],
}


@pytest.mark.parametrize("estimator", [["maxrl"], ["passk", "--algo.advantage.passk_k", "2"], ["grpo"]])
@pytest.mark.parametrize("penalty", sorted(PENALTIES))
def test_score_input_with_a_length_penalty_is_refused(parse, capfd, estimator, penalty):
    with pytest.raises(SystemExit) as exc:
        parse("--algo.advantage.estimator", *estimator, "--rollout.n_samples_per_prompt", "4",
              "--algo.advantage.input", "score", *PENALTIES[penalty])
    assert exc.value.code == 2
    err = capfd.readouterr().err
    assert f"--algo.advantage.input score cannot be combined with {PENALTIES[penalty][0]}" in err
    assert "silently ignored" in err and "binary" in err


def test_both_penalties_are_named(parse, capfd):
    with pytest.raises(SystemExit):
        parse("--algo.advantage.estimator", "maxrl", "--rollout.n_samples_per_prompt", "4", "--algo.advantage.input",
              "score", *PENALTIES["overlong"], *PENALTIES["stop_properly"])
    err = capfd.readouterr().err
    assert "--reward.overlong_buffer_len (DAPO overlong penalty) and --reward.stop_properly_penalty_coef" in err


@pytest.mark.parametrize("argv", [
    ["--algo.advantage.estimator", "maxrl", "--algo.advantage.input", "score"],         # no penalty
    ["--algo.advantage.estimator", "grpo", *PENALTIES["overlong"]],                      # penalties reach the rewards
    ["--algo.advantage.estimator", "grpo", "--algo.advantage.input", "reward", *PENALTIES["stop_properly"]],
    ["--algo.advantage.estimator", "group_norm", *PENALTIES["overlong"]],                # OpenRLHF's own path
])
def test_combinations_that_keep_the_penalty_pass(parse, argv):
    args = parse(*argv, "--rollout.n_samples_per_prompt", "4")
    assert args.algo.advantage.estimator == argv[1]

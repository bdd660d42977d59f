"""verl's own CPU unit tests for core_algos (estimators, policy losses, loss aggregation) still
pass with the rlhf_ext plugin loaded (.venv-verl).

verl's wheel installs them as a top-level ``tests`` package. They run in a subprocess (their
``tests`` package would clash with this session's module names) that also asserts the plugin was
active in that same process. The wheel ships no unit tests for reward scoring; the reward entry is
exercised through verl's reward managers in test_verl_rewards.py. Left out:
``tests/trainer/test_multi_trajectories_advantage_on_cpu.py`` needs verl's TransferQueue extra.
"""

import os
import subprocess
import sys
import textwrap

import verl

UPSTREAM = [
    "tests/trainer/ppo/test_core_algos_on_cpu.py",
    "tests/trainer/ppo/test_loss_aggregation_on_cpu.py",
    "tests/trainer/ppo/test_dynamic_policy_losses_on_cpu.py",
    "tests/trainer/ppo/test_reinforce_pp_multiturn_on_cpu.py",
    "tests/trainer/ppo/test_value_loss_normalization_on_cpu.py",
]


def test_verls_own_core_algos_tests_pass_with_the_plugin():
    site = os.path.dirname(os.path.dirname(verl.__file__))
    missing = [p for p in UPSTREAM if not os.path.exists(os.path.join(site, p))]
    assert not missing, f"verl's wheel no longer ships {missing}"
    code = textwrap.dedent(f"""
        import sys, pytest
        from verl.trainer.ppo import core_algos
        # checked before the run: verl's registry tests clear ADV_ESTIMATOR_REGISTRY
        assert "rlhf_ext_passk" in core_algos.ADV_ESTIMATOR_REGISTRY, "plugin was not active"
        assert "rlhf_ext_ppo" in core_algos.POLICY_LOSS_REGISTRY, "plugin was not active"
        sys.exit(int(pytest.main(["-q", "-p", "no:cacheprovider", "-W", "ignore::UserWarning", *{UPSTREAM!r}])))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_USE_EXTERNAL", "RLHF_EXT_VERL"))}
    proc = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout

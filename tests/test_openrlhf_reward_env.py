"""Reward flags -> rlhf_ext's OpenRLHF reward file and its environment variables."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rlhf_ext.patches.openrlhf.reward_env import resolve_reward_flags
from rlhf_ext.rewards.path import reward_file_path

FILE = reward_file_path()


def test_shortcut_url_and_grader_flags():
    url, env = resolve_reward_flags("rlhf_ext:accuracy:1.0,format:0.2", grader_timeout=3, grader_workers=2, environ={})
    assert url == FILE
    assert env == {"RLHF_EXT_REWARD": "accuracy:1.0,format:0.2", "RLHF_EXT_REWARD_TIMEOUT": "3.0",
                   "RLHF_EXT_REWARD_WORKERS": "2"}  # fmt: skip


def test_functions_flag_implies_the_file_and_presets_work():
    assert resolve_reward_flags(None, "math", environ={}) == (FILE, {"RLHF_EXT_REWARD": "math"})
    assert resolve_reward_flags("rlhf_ext:math", "math", environ={}) == (FILE, {"RLHF_EXT_REWARD": "math"})
    assert resolve_reward_flags(FILE, "open_r1", environ={}) == (FILE, {"RLHF_EXT_REWARD": "open_r1"})
    assert resolve_reward_flags("rlhf_ext", environ={}) == (FILE, {})  # the file's default reward


def test_other_urls_pass_through():
    assert resolve_reward_flags("http://rm:5000/get_reward", environ={}) == ("http://rm:5000/get_reward", {})
    assert resolve_reward_flags(None, environ={}) == (None, {})
    assert resolve_reward_flags("/my/reward.py", environ={}) == ("/my/reward.py", {})
    # the file by its path accepts the grader flags too
    assert resolve_reward_flags(FILE, grader_workers=3, environ={}) == (FILE, {"RLHF_EXT_REWARD_WORKERS": "3"})


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(remote_url="rlhf_ext:"), "name a reward after 'rlhf_ext:'"),
        (dict(remote_url="rlhf_ext:nosuch"), "unknown reward 'nosuch'"),
        (dict(remote_url="rlhf_ext:math", functions="open_r1"), "disagree"),
        (dict(remote_url="http://x", functions="math"), "drop --reward.remote_url"),
        (dict(remote_url=None, grader_timeout=2.0), "configure rlhf_ext's reward file"),
        (dict(remote_url="rlhf_ext:math", grader_timeout=0.0), "grader_timeout must be > 0"),
        (dict(remote_url="rlhf_ext:math", grader_workers=0), "grader_workers must be >= 1"),
        (dict(remote_url=None, functions="  "), "needs a reward spec"),
    ],
)
def test_bad_reward_flags(kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_reward_flags(environ={}, **kwargs)


def test_existing_environment_is_validated_with_the_flags():
    with pytest.raises(ValueError, match="RLHF_EXT_REWARD_TIMEOUT"):
        resolve_reward_flags("rlhf_ext:math", environ={"RLHF_EXT_REWARD_TIMEOUT": "soon"})


ROLLOUT = textwrap.dedent(
    """
    import asyncio, json, sys
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(json.loads(sys.argv[1]))  # what a rollout actor builds
    queries = ["Q: 6 x 7? A: The answer is \\\\boxed{42}", "Q: 6 x 7? A: The answer is \\\\boxed{41}"]
    out = asyncio.run(executor._fetch_rewards_via_func(queries, ["Q: 6 x 7?"] * 2, ["42", "42"]))
    print(json.dumps([float(o["rewards"][0]) for o in out]))
    """
)


def test_end_to_end_with_the_real_reward_file_as_openrlhf_loads_it():
    url, env = resolve_reward_flags("rlhf_ext:accuracy:1.0", grader_timeout=5, grader_workers=1, environ={})
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}
    child_env.update(env)
    remote_urls = url.split(",")  # OpenRLHF's own post-processing of --reward.remote_url
    out = subprocess.run([sys.executable, "-c", ROLLOUT, json.dumps(remote_urls)], capture_output=True, text=True,
                         env=child_env, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1.0, 0.0]

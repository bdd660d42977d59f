"""The CPU target's process layout (rlhf_ext.patches.retarget.cpu_processes): vLLM's model runner in the
engine-core process and no Ray dashboard, each unless asked otherwise; nothing changes on other targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rlhf_ext.patches.retarget.cpu_processes import (ENV_RAY_DASHBOARD, ENV_VLLM_MULTIPROCESSING, dashboard_wanted,
                                                      prefer_single_process_vllm, ray_init_kwargs)


def test_defaults_only_fill_what_is_unset():
    env = {}
    prefer_single_process_vllm(env)
    assert env == {ENV_VLLM_MULTIPROCESSING: "0"}
    kept = {ENV_VLLM_MULTIPROCESSING: "1"}
    prefer_single_process_vllm(kept)
    assert kept == {ENV_VLLM_MULTIPROCESSING: "1"}


@pytest.mark.parametrize("value, wanted", [("", False), ("0", False), ("off", False), ("1", True), ("TRUE", True)])
def test_dashboard_switch(value, wanted):
    assert dashboard_wanted({ENV_RAY_DASHBOARD: value}) is wanted
    assert dashboard_wanted({}) is False


def test_dashboard_switch_names_a_bad_value():
    with pytest.raises(ValueError, match="RLHF_EXT_RAY_DASHBOARD='maybe': expected 1 or 0"):
        dashboard_wanted({ENV_RAY_DASHBOARD: "maybe"})


def test_ray_init_kwargs_on_each_target():
    base = {"runtime_env": {"env_vars": {"A": "1"}}}
    assert ray_init_kwargs(base, "cpu", {}) == {**base, "include_dashboard": False}
    assert base == {"runtime_env": {"env_vars": {"A": "1"}}}  # the caller's dict is not changed
    for target in ("cuda", "npu", None):
        assert ray_init_kwargs(base, target, {}) == base
    assert ray_init_kwargs({**base, "include_dashboard": True}, "cpu", {})["include_dashboard"] is True
    assert ray_init_kwargs(base, "cpu", {ENV_RAY_DASHBOARD: "1"}) == base
    # joining an existing cluster: its dashboard is not this call's to choose
    assert ray_init_kwargs({"address": "10.0.0.1:6379"}, "cpu", {}) == {"address": "10.0.0.1:6379"}


_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from rlhf_ext.patches import activate
    activate(["rlhf_ext"], role="test")
    import ray
    info = ray.init(num_cpus=1, log_to_driver=False)
    print(json.dumps({"dashboard_url": info.dashboard_url,
                      "vllm_mp": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")}))
    ray.shutdown()
    """
)


def _probe(**env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_") and k != ENV_VLLM_MULTIPROCESSING}
    full.pop("RAY_ADDRESS", None)
    full.update(env)
    res = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=full)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_plugin_on_the_cpu_target_starts_ray_without_its_dashboard_and_exports_the_vllm_layout():
    """The real plugin activation and the real ``ray.init`` (a local cluster) in a fresh interpreter."""
    assert _probe(RLHF_EXT_DEVICE="cpu") == {"dashboard_url": "", "vllm_mp": "0"}

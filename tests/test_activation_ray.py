"""The plugin across a real local Ray cluster.

The cluster is started here *without* the plugin, like a long-running cluster. A separate driver
process then joins it the way a ``ray job submit`` entrypoint does (job config in
``RAY_JOB_CONFIG_JSON_ENV_VAR``, ``RAY_ADDRESS`` set) with ``--plugin rlhf_ext`` on its command
line, and an actor of that job reports what it sees.
"""

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import ray
import torch

from rlhf_ext.algorithms import grpo, kl_estimate
from rlhf_ext.patches.activation.ray_env import SETUP_HOOK, with_plugin_runtime_env


@pytest.fixture(scope="module")
def cluster():
    from rlhf_ext.patches import is_active

    assert not is_active("rlhf_ext")
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("RLHF_EXT_")}
    init = getattr(ray.init, "__wrapped__", ray.init)
    info = init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield info.address_info["gcs_address"]
    finally:
        ray.shutdown()
        os.environ.update(saved)


DRIVER = textwrap.dedent(
    """
    import json, os, sys
    import ray

    @ray.remote(num_cpus=1)
    class Probe:
        def report(self):
            import os
            import torch
            from types import SimpleNamespace
            from rlhf_ext.patches import active_plugins
            from rlhf_ext.patches.openrlhf import compat
            from openrlhf.trainer.ppo_utils import experience_maker as em
            from openrlhf.trainer.ppo_utils.experience import Experience

            maker = em.RemoteExperienceMaker.__new__(em.RemoteExperienceMaker)
            maker.advantage_estimator = "grpo"
            maker.kl_ctl = SimpleNamespace(value=0.0)
            maker.strategy = SimpleNamespace(args=SimpleNamespace(
                rollout=SimpleNamespace(n_samples_per_prompt=4), reward=SimpleNamespace(clip_range=None),
                algo=SimpleNamespace(advantage=SimpleNamespace(estimator="grpo", gamma=1.0))))
            rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
            exp = Experience(index=list(range(8)), rewards=rewards, action_mask=torch.ones(8, 2),
                             kl=torch.zeros(8, 2), info={})
            out = maker.compute_advantages_and_returns([exp])[0]
            return {
                "pid": os.getpid(),
                "env": {k: os.environ.get(k) for k in ("RLHF_EXT_PLUGINS", "RLHF_EXT_REWARD", "JOB_VAR",
                                                       "TOKENIZERS_PARALLELISM")},
                "active": active_plugins(),
                "patched": compat.is_patched(em.RemoteExperienceMaker.compute_advantages_and_returns),
                "applied": compat.applied(),
                "advantages": out.advantages[:, 0].tolist(),
            }

    # what OpenRLHF's train() does: its own env_vars in the runtime env
    ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})
    report = ray.get(Probe.remote().report.remote(), timeout=240)
    report["driver_argv"] = sys.argv[1:]
    print(json.dumps(report))
    ray.shutdown()
    """
)


def test_job_on_existing_cluster_reaches_actor(cluster, tmp_path):
    script = tmp_path / "openrlhf" / "cli" / "fake_train.py"  # looks like an OpenRLHF CLI to the hook
    script.parent.mkdir(parents=True)
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}
    env.update(
        RAY_ADDRESS=cluster,
        JOB_VAR="from-job",
        RLHF_EXT_REWARD="math",
        RAY_JOB_CONFIG_JSON_ENV_VAR=json.dumps({"runtime_env": {"env_vars": {"JOB_VAR": "from-job"}}, "metadata": {}}),
    )
    out = subprocess.run([sys.executable, str(script), "--plugin", "rlhf_ext", "--x"], capture_output=True, text=True,
                         env=env, timeout=400)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["driver_argv"] == ["--x"]
    assert report["env"] == {"RLHF_EXT_PLUGINS": "rlhf_ext", "RLHF_EXT_REWARD": "math", "JOB_VAR": "from-job",
                             "TOKENIZERS_PARALLELISM": "true"}  # fmt: skip
    assert report["active"] == {"rlhf_ext": "ray-worker"}
    assert report["patched"] is True
    assert "advantage estimators" in report["applied"]["openrlhf.trainer.ppo_utils.experience_maker"]
    expected = grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])).reshape(-1)
    torch.testing.assert_close(torch.tensor(report["advantages"]), expected)


def test_cluster_itself_carries_no_plugin(cluster):
    @ray.remote(num_cpus=1)
    def env_of_worker():
        import os
        import sys

        return os.environ.get("RLHF_EXT_PLUGINS"), [m for m in sys.modules if m.startswith("rlhf_ext.")]

    plugins, modules = ray.get(env_of_worker.remote(), timeout=120)
    assert plugins is None and modules == []


def test_runtime_env_merge_rules():
    environ = {"RLHF_EXT_PLUGINS": "rlhf_ext", "RLHF_EXT_REWARD": "math", "OTHER": "x"}
    env = with_plugin_runtime_env({"env_vars": {"A": "1"}}, environ=environ)
    assert env == {"env_vars": {"A": "1", "RLHF_EXT_PLUGINS": "rlhf_ext", "RLHF_EXT_REWARD": "math"},
                   "worker_process_setup_hook": SETUP_HOOK}  # fmt: skip
    # a submitted job that already sets a variable or a hook: Ray refuses duplicate keys, so we add neither
    job = {"runtime_env": {"env_vars": {"RLHF_EXT_PLUGINS": "rlhf_ext"}, "worker_process_setup_hook": "my.hook"}}
    environ["RAY_JOB_CONFIG_JSON_ENV_VAR"] = json.dumps(job)
    env = with_plugin_runtime_env(None, environ=environ)
    assert env == {"env_vars": {"RLHF_EXT_REWARD": "math"}}
    # the caller's own value wins
    env = with_plugin_runtime_env({"env_vars": {"RLHF_EXT_REWARD": "open_r1"}}, environ={"RLHF_EXT_REWARD": "math"})
    assert env["env_vars"] == {"RLHF_EXT_REWARD": "open_r1"}


class _Group:
    """Stands in for a RayActorGroup: returns precomputed forward outputs through real Ray object refs."""

    def __init__(self, outputs):
        self.outputs = outputs

    def async_run_method_batch(self, method_name, **kwargs):
        assert method_name == "forward"
        return [ray.put(self.outputs)]


def test_make_experience_reports_kl_clip_fraction(cluster):
    from rlhf_ext.patches import activate, deactivate

    activate(["rlhf_ext"], role="test")
    try:
        from openrlhf.trainer.ppo_utils import experience_maker as em
        from openrlhf.trainer.ppo_utils.experience import Experience

        torch.manual_seed(0)
        masks = [torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool), torch.tensor([[1, 1, 1, 1]], dtype=torch.bool)]
        actor_lp = [-torch.rand(m.shape) for m in masks]
        ref_lp = [lp + torch.randn(lp.shape) * 0.3 for lp in actor_lp]
        samples = [
            Experience(sequences=torch.zeros(m.shape, dtype=torch.long), attention_mask=torch.ones(m.shape),
                       action_mask=m, rewards=torch.ones(m.shape[0]), info={})
            for m in masks
        ]  # fmt: skip
        maker = em.RemoteExperienceMaker.__new__(em.RemoteExperienceMaker)
        maker.actor_model_group, maker.initial_model_group = _Group(actor_lp), _Group(ref_lp)
        maker.critic_model_group = maker.reward_model_group = None
        args = SimpleNamespace(
            ds=SimpleNamespace(ring_attn_size=1, tensor_parallel_size=1),
            train=SimpleNamespace(colocate_all=False, colocate_actor_ref=False, colocate_critic_reward=False),
            algo=SimpleNamespace(kl=SimpleNamespace(use_loss=False, estimator="k3", clip=[-0.02, 0.02])),
        )
        maker.strategy = SimpleNamespace(args=args)
        out = maker.make_experience(samples)
        for exp, lp, ref, m in zip(out, actor_lp, ref_lp, masks):
            raw, _ = kl_estimate(lp, ref, "k3", clip=None)
            clamped, _ = kl_estimate(lp, ref, "k3", clip=(-0.02, 0.02))
            torch.testing.assert_close(exp.kl, clamped)
            expected = (((raw > 0.02) | (raw < -0.02)) & m).sum(-1) / m.sum(-1)
            torch.testing.assert_close(exp.info["kl_clip_frac"], expected.float())
        assert any(float(e.info["kl_clip_frac"].max()) > 0 for e in out)
    finally:
        deactivate()

"""The plugin's ``ray.remote`` hook (patches applied to actor classes before Ray copies their methods)
must leave every other use of ``ray.remote`` exactly as Ray made it."""

from __future__ import annotations

import ray
from ray.remote_function import RemoteFunction

from rlhf_ext.patches.activation.ray_env import make_ray_remote


def _f():
    return 1


def test_plain_remote_functions_stay_remote_functions():
    remote = make_ray_remote(ray.remote)
    # `@ray.remote def f` -- a RemoteFunction is callable, but it is the result, not a decorator
    direct = remote(_f)
    assert isinstance(direct, RemoteFunction) and hasattr(direct, "options")
    with_options = remote(num_cpus=0.5)(_f)
    assert isinstance(with_options, RemoteFunction) and hasattr(with_options, "options")


def test_actor_classes_pass_through_the_pre_decoration_hooks():
    from rlhf_ext.patches.activation import ray_env

    seen = []
    ray_env._before_actor_class.append(seen.append)
    try:
        remote = make_ray_remote(ray.remote)

        class A:
            pass

        class B:
            pass

        remote(A)
        remote(num_cpus=1)(B)
        assert seen == [A, B]
    finally:
        ray_env._before_actor_class.remove(seen.append)


def _run_fresh(code: str) -> dict:
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_ray_carriage_is_host_neutral():
    """MindSpeed-RL's activation patches ``ray.init`` without loading any of OpenRLHF's glue (its run
    record start came along with the carriage once); a host's own step at ``ray.init`` runs only when
    that host asked for it, after the runtime env is built and before Ray starts, and what it returns
    is what Ray gets."""
    res = _run_fresh(
        "import json, sys\n"
        "from rlhf_ext.patches import mindspeed_rl\n"
        "mindspeed_rl.activate('process')\n"
        "import ray\n"
        "from rlhf_ext.patches.activation import ray_env\n"
        "calls = []\n"
        "init = ray_env.make_ray_init(lambda **kw: calls.append([sorted(kw['runtime_env']), sorted(kw)]))\n"
        "init(runtime_env={})\n"
        "ray_env.before_ray_init(lambda kw: calls.append('host step') or {**kw, 'include_dashboard': False})\n"
        "init(runtime_env={})\n"
        "print(json.dumps({'patched': getattr(ray.init, '__rlhf_ext_patch__', None), 'calls': calls,\n"
        "                  'openrlhf_glue': sorted(m for m in sys.modules if m.startswith('rlhf_ext.patches.openrlhf'))}))\n"
    )
    assert res["patched"] == "ray.init runtime env"
    assert res["openrlhf_glue"] == []
    assert res["calls"] == [[["worker_process_setup_hook"], ["runtime_env"]], "host step",
                            [["worker_process_setup_hook"], ["include_dashboard", "runtime_env"]]]


def test_openrlhf_starts_its_run_record_at_ray_init():
    res = _run_fresh(
        "import json\n"
        "from rlhf_ext.patches import openrlhf\n"
        "openrlhf.activate('process')\n"
        "import ray\n"
        "from rlhf_ext.patches.activation import ray_env\n"
        "print(json.dumps([f.__module__ + '.' + f.__name__ for f in ray_env._before_init]))\n"
    )
    assert res == ["rlhf_ext.patches.openrlhf._before_ray_init"]

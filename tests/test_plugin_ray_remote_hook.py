"""The plugin's ``ray.remote`` hook (patches applied to actor classes before Ray copies their methods)
must leave every other use of ``ray.remote`` exactly as Ray made it."""

from __future__ import annotations

import ray
from ray.remote_function import RemoteFunction

from rlhf_ext.patches.openrlhf.ray_env import make_ray_remote


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
    from rlhf_ext.patches.openrlhf import ray_env

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

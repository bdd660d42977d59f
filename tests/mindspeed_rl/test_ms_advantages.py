"""The real ``@ray.remote compute_advantage`` task, on a local Ray, plugin active through the environment."""

import pytest
import ray
import torch
from ms_helpers import dock_columns, fresh_dock
from types import SimpleNamespace

from rlhf_ext.algorithms import available_advantages, get_advantage, host_inputs, whiten
from rlhf_ext.patches.mindspeed_rl import ConfiguredName, compat

TOKENIZER = SimpleNamespace(pad=0, eod=0)
# 2 prompts x 4 samples, binary scores (Pass@k and MaxRL need 0/1), varied lengths.
SCORES = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
LENGTHS = [3, 5, 2, 4, 6, 1, 3, 5]
N = 4


def run_task(task, estimator, scores=SCORES, lengths=LENGTHS, micro=8):
    dock = fresh_dock(dock_columns(scores, lengths))
    ray.get(task.options(num_cpus=0.1).remote(
        dock, 1.0, 0.95, adv_estimator=estimator, experience_count=micro, tokenizer=TOKENIZER,
        global_batch_size=len(scores), guarantee_order=False, n_sample_per_prompt=N))
    adv = ray.get(dock.result.remote("advantages"))
    ret = ray.get(dock.result.remote("returns"))
    assert sorted(adv) == list(range(len(scores))), "every sample got advantages"
    return [adv[i] for i in range(len(scores))], [ret[i] for i in range(len(scores))]


def expected(name, options=None):
    grouped = torch.tensor(SCORES).reshape(-1, N)
    inputs = {"lengths": torch.tensor(LENGTHS, dtype=torch.float32).reshape(-1, N)}
    fn = get_advantage(name)
    adv = fn(grouped, **(options or {}), **{k: inputs[k] for k in host_inputs(fn)}).reshape(-1)
    width = max(LENGTHS)
    mask = torch.tensor([[1.0 if t < length else 0.0 for t in range(width)] for length in LENGTHS])
    tokens = adv[:, None] * mask
    if name in ("reinforce_pp", "reinforce_pp_baseline"):
        tokens = whiten(tokens, mask.bool())
    return [tokens[i, :length] for i, length in enumerate(LENGTHS)]


def test_the_trainers_use_the_patched_task(local_ray):
    from mindspeed_rl.trainer import dapo_trainer_hybrid, grpo_trainer_hybrid, ppo_trainer_hybrid
    from mindspeed_rl.trainer.utils import compute_utils

    from rlhf_ext.patches.mindspeed_rl import advantages

    for module in (compute_utils, grpo_trainer_hybrid, dapo_trainer_hybrid, ppo_trainer_hybrid):
        assert module.compute_advantage is advantages.compute_advantage, module.__name__


# estimators that need the reward's components or an agent's turns are refused at start-up (MindSpeed-RL has
# only rm_scores)
@pytest.mark.parametrize("name", [n for n in available_advantages()
                                  if not {"components", "turns"} & set(host_inputs(get_advantage(n)))])
def test_every_rlhf_ext_estimator_spreads_its_values_over_the_tokens(local_ray, name):
    from mindspeed_rl.trainer.utils import compute_utils

    options = {"k": 2} if name == "passk" else {}
    estimator = ConfiguredName(name, {"adv_estimator_options": options}) if options else name
    adv, ret = run_task(compute_utils.compute_advantage, estimator)
    for got, want, length in zip(adv, expected(name, options), LENGTHS):
        assert got.shape == (length,)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for a, r in zip(adv, ret):
        assert torch.equal(a, r)


def test_rloo_hand_computed(local_ray):
    from mindspeed_rl.trainer.utils import compute_utils

    # micro-batches of one group each (adv_dispatch_size = n), as MindSpeed-RL hands them out
    adv, _ = run_task(compute_utils.compute_advantage, "rloo", micro=4)
    # group 1: scores 1,0,0,1 -> r - mean(others): 1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3
    assert torch.allclose(adv[0], torch.full((3,), 2 / 3))
    assert torch.allclose(adv[1], torch.full((5,), -2 / 3))
    # group 2: 0,0,0,1
    assert torch.allclose(adv[7], torch.full((5,), 1.0))
    assert torch.allclose(adv[4], torch.full((6,), -1 / 3))


@pytest.mark.parametrize("name", ["group_norm", "gae"])
def test_mindspeed_estimators_are_unchanged(local_ray, name):
    from mindspeed_rl.trainer.utils import compute_utils

    builtin = compat.original(compute_utils, "compute_advantage")
    assert builtin is not compute_utils.compute_advantage
    if name == "gae":
        # gae needs the critic's values column as well.
        columns = dock_columns(SCORES, LENGTHS)
        columns["values"] = [torch.linspace(0, 1, length) for length in LENGTHS]

        def run(task):
            dock = fresh_dock(columns)
            ray.get(task.options(num_cpus=0.1).remote(
                dock, 1.0, 0.95, adv_estimator="gae", experience_count=8, tokenizer=TOKENIZER,
                global_batch_size=8, guarantee_order=False, n_sample_per_prompt=N))
            got = ray.get(dock.result.remote("advantages"))
            return [got[i] for i in range(8)]

        patched, unpatched = run(compute_utils.compute_advantage), run(builtin)
    else:
        patched, _ = run_task(compute_utils.compute_advantage, name)
        unpatched, _ = run_task(builtin, name)
    for a, b in zip(patched, unpatched):
        assert torch.equal(a, b)
    if name == "group_norm":
        g = torch.tensor(SCORES[:4])
        want = (g - g.mean()) / (g.std() + 1e-6)
        assert torch.allclose(patched[0], torch.full((3,), float(want[0])))


def test_bad_group_size_is_reported_by_the_task(local_ray):
    from mindspeed_rl.trainer.utils import compute_utils

    dock = fresh_dock(dock_columns(SCORES[:6], LENGTHS[:6]))
    with pytest.raises(ray.exceptions.RayTaskError, match="groups of n_samples_per_prompt=4"):
        ray.get(compute_utils.compute_advantage.options(num_cpus=0.1).remote(
            dock, 1.0, 0.95, adv_estimator="rloo", experience_count=6, tokenizer=TOKENIZER,
            global_batch_size=6, guarantee_order=False, n_sample_per_prompt=N))


def test_new_estimators_hand_computed(local_ray):
    from mindspeed_rl.trainer.utils import compute_utils

    # OPO, group 1: scores 1, 0, 0, 1 with lengths 3, 5, 2, 4 -> baseline (3 + 4) / 14 = 0.5
    adv, _ = run_task(compute_utils.compute_advantage, "opo")
    assert [a[0].item() for a in adv[:4]] == pytest.approx([0.5, -0.5, -0.5, 0.5])
    # GPG: B = 8, both groups varied -> alpha = 1; A = r - mean (group 2 mean 1/4)
    adv, _ = run_task(compute_utils.compute_advantage, "gpg")
    assert [a[0].item() for a in adv] == pytest.approx([0.5, -0.5, -0.5, 0.5, -0.25, -0.25, -0.25, 0.75])
    # passk_best: only the first best sample of each group, (1 - 1) / std = 0 in group 1 (a tie), and
    # (1 - 0) / std in group 2 (std of 0, 0, 0, 1 = 1/2)
    adv, _ = run_task(compute_utils.compute_advantage, "passk_best")
    assert [a[0].item() for a in adv] == pytest.approx([0, 0, 0, 0, 0, 0, 0, 2.0], abs=1e-4)


def test_gdpo_is_refused_at_config_time():
    from rlhf_ext.patches.mindspeed_rl.config import ConfigError, check_estimator

    with pytest.raises(ConfigError, match="receives only the summed rm_scores"):
        check_estimator("gdpo", {})
    with pytest.raises(ConfigError, match="lengths comes from the rollouts"):
        check_estimator("opo", {"lengths": 3})

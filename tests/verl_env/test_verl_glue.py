"""rlhf_ext inside real verl 0.9.1: entry point, estimators, losses, KL clamp (runs in .venv-verl).

tests/test_verl_env.py runs this directory with .venv-verl's Python; the main environment cannot
import verl (see scripts/setup_verl_env.sh), so conftest.py keeps it out of the main collection.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import verl  # noqa: F401  (loads the verl.plugins entry points, rlhf_ext's included)
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

import rlhf_ext.patches.verl as glue


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERL_USE_EXTERNAL", "RLHF_EXT_VERL"))}
    env.update(extra)
    return env


class _Probes:
    """Fresh interpreters (``import verl`` from scratch), started together once per module: each
    costs seconds of start-up, and they are independent."""

    def __init__(self, specs):
        self.procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                             env=_env(**env))
                      for name, (argv, env) in specs.items()}
        self.results = {}

    def raw(self, name):
        if name not in self.results:
            out, err = self.procs[name].communicate(timeout=300)
            self.results[name] = (self.procs[name].returncode, out, err)
        return self.results[name]

    def json(self, name) -> dict:
        """The JSON objects the probe printed (one per line), merged."""
        rc, out, err = self.raw(name)
        assert rc == 0, err[-3000:]
        merged = {}
        for line in out.splitlines():
            if line.startswith("{"):
                merged.update(json.loads(line))
        return merged


# --------------------------------------------------------------------------------------------
# Entry point


PROBE = """
    import json, sys
    before = sorted(m for m in sys.modules if m.startswith("rlhf_ext"))
    import verl
    loaded = "rlhf_ext.patches.verl.plugin" in sys.modules
    from verl.trainer.ppo import core_algos
    print(json.dumps({
        "before": before, "loaded": loaded,
        "adv": sorted(k for k in core_algos.ADV_ESTIMATOR_REGISTRY if k.startswith("rlhf_ext")),
        "loss": sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith("rlhf_ext")),
        "verl_grpo": core_algos.ADV_ESTIMATOR_REGISTRY["grpo"].__module__,
        "verl_passk": core_algos.ADV_ESTIMATOR_REGISTRY["grpo_passk"].__module__,
    }))
"""


KL_PROBE = """
    import json, torch
    from verl.trainer.ppo import core_algos
    from verl.workers.utils import losses   # imports kl_penalty by name: the actor's KL loss path
    lp = torch.tensor([[0.0, -30.0, 3.0]]); ref = torch.zeros(1, 3)
    out = {name: losses.kl_penalty(lp, ref, name).tolist()[0] for name in ("low_var_kl", "kl", "mse", "abs", "k3+")}
    print(json.dumps(out))
"""

CHECK_AND_KL = """
    import contextlib, io
    from rlhf_ext.patches.verl.__main__ import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main([])
""" + KL_PROBE.replace("print(json.dumps(out))", "print(json.dumps({'check': [rc, buf.getvalue()], 'kl': out}))")


THIRD_PARTY_MODULE = '''
import torch
from rlhf_ext.algorithms import register_advantage


@register_advantage("third_party_sign")
def third_party_sign(scores):
    """A third party's estimator: the sign of r - group mean."""
    return torch.sign(scores - scores.mean(dim=1, keepdim=True))
'''


def _third_party_package(root) -> str:
    """A distribution declaring an ``rlhf_ext.algorithms`` entry point, on a path of its own."""
    info = os.path.join(root, "tp_algos-1.0.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(root, "tp_algos.py"), "w") as f:
        f.write(THIRD_PARTY_MODULE)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: tp-algos\nVersion: 1.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[rlhf_ext.algorithms]\ntp = tp_algos\n")
    return root


THIRD_PARTY_PROBE = PROBE + """
    import numpy as np, torch
    fn = core_algos.get_adv_estimator_fn("rlhf_ext_third_party_sign")
    adv, _ = fn(torch.tensor([[1.0], [0.0], [0.0]]), torch.ones(3, 1), index=np.array(["u"] * 3, dtype=object))
    print(json.dumps({"third_party": adv[:, 0].tolist()}))
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    py = sys.executable
    third_party = _third_party_package(str(tmp_path_factory.mktemp("third_party")))

    def code(text):
        return [py, "-c", textwrap.dedent(text)]

    # each costs an `import verl`: the default run also runs the check command's main() and the KL probe
    return _Probes({
        "default": (code(PROBE + CHECK_AND_KL), {}),
        "off": (code(PROBE), {"VERL_USE_EXTERNAL_PLUGINS": "none"}),
        "kl_range": (code(KL_PROBE), {"RLHF_EXT_VERL_KL_CLIP": "-2,5"}),
        "kl_bad": (code("from verl.trainer.ppo import core_algos"), {"RLHF_EXT_VERL_KL_CLIP": "5,-5"}),
        "third_party": (code(THIRD_PARTY_PROBE), {"PYTHONPATH": third_party}),
    })


def test_import_verl_discovers_the_entry_point_and_registers_everything(probes):
    from rlhf_ext.algorithms import available_advantages, available_policy_losses, available_token_advantages

    out = probes.json("default")
    assert out["before"] == [], "the probe must not import rlhf_ext itself"
    assert out["loaded"]
    # every outcome estimator, plus the token-level ones (fed by the patched compute_advantage)
    assert available_token_advantages() == ["optimal_token_baseline", "tir_optimal_token_baseline"]
    assert out["adv"] == sorted("rlhf_ext_" + n for n in available_advantages() + available_token_advantages())
    assert {"rlhf_ext_passk", "rlhf_ext_maxrl", "rlhf_ext_dr_grpo"} <= set(out["adv"])
    assert out["loss"] == sorted("rlhf_ext_" + n for n in available_policy_losses())
    # verl's own names keep verl's implementations
    assert out["verl_grpo"] == out["verl_passk"] == "verl.trainer.ppo.core_algos"


def test_verl_use_external_plugins_none_turns_it_off(probes):
    out = probes.json("off")
    assert not out["loaded"]
    assert out["adv"] == [] and out["loss"] == []


def test_third_party_estimators_from_the_rlhf_ext_entry_point_appear_in_verl(probes):
    out = probes.json("third_party")
    assert "rlhf_ext_third_party_sign" in out["adv"] and out["before"] == []
    assert out["third_party"] == [1.0, -1.0, -1.0]


def test_check_command_reports_what_is_registered(probes):
    rc, out = probes.json("default")["check"]
    assert rc == 0, out
    assert "plugin loaded through the verl.plugins entry point" in out
    assert "rlhf_ext_passk" in out and "KL clamp: verl default" in out


def test_registration_is_idempotent_and_never_replaces_verl_names():
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    glue.register_all(core_algos)
    assert core_algos.ADV_ESTIMATOR_REGISTRY == before
    from rlhf_ext.algorithms import register_advantage
    from rlhf_ext.algorithms.registry import ADVANTAGES

    # A new rlhf_ext estimator (as issue 13's `rft` will be) appears on the next registration.
    @register_advantage("test_centered_x2")
    def centered_x2(scores):
        return 2 * (scores - scores.mean(dim=1, keepdim=True))

    try:
        glue.register_all(core_algos)
        fn = core_algos.get_adv_estimator_fn("rlhf_ext_test_centered_x2")
        adv, _ = fn(torch.tensor([[0.0], [1.0]]), torch.ones(2, 1), index=np.array(["u", "u"], dtype=object))
        assert adv[:, 0].tolist() == [-1.0, 1.0]
    finally:
        ADVANTAGES.unregister("test_centered_x2")
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("rlhf_ext_test_centered_x2", None)


def test_seam_mismatch_is_a_clear_error():
    import types

    fake = types.ModuleType("verl.trainer.ppo.core_algos")
    fake.register_adv_est = lambda name: None  # wrong parameter name
    problems = glue.check_seams(fake, kl=True)
    assert any("register_adv_est has parameters (name), expected (name_or_enum)" in p for p in problems)
    assert any("agg_loss does not exist" in p for p in problems)
    with pytest.raises(glue.VerlCompatibilityError, match="nothing was registered"):
        glue.register_all(fake)
    with pytest.raises(glue.VerlCompatibilityError, match="RLHF_EXT_VERL_KL_CLIP is set"):
        glue.patch_kl(fake, "-5,5")


# --------------------------------------------------------------------------------------------
# Advantages through verl's own compute_advantage

# Two prompts, 4 samples each, rows interleaved the way they are NOT grouped by position:
# uid "b" = rows 0, 2, 5, 7 -> scores 1, 0, 1, 0;  uid "a" = rows 1, 3, 4, 6 -> scores 0, 0, 1, 0.
UIDS = np.array(["b", "a", "b", "a", "a", "b", "a", "b"], dtype=object)
SCORES = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
LENGTHS = [3, 1, 2, 3, 2, 1, 3, 2]
T = 3


def _batch(scores=SCORES, uids=UIDS, lengths=LENGTHS) -> DataProto:
    n = len(scores)
    mask = torch.zeros(n, T)
    rewards = torch.zeros(n, T)
    for i, length in enumerate(lengths):
        mask[i, :length] = 1
        rewards[i, length - 1] = scores[i]  # outcome reward on the last response token, as verl puts it
    return DataProto.from_dict(tensors={"token_level_rewards": rewards, "response_mask": mask},
                               non_tensors={"uid": np.asarray(uids, dtype=object)})


def _advantages(estimator: str, **options) -> torch.Tensor:
    config = OmegaConf.create({"adv_estimator": estimator, "norm_adv_by_std_in_grpo": True,
                               **({"rlhf_ext": options} if options else {})})
    data = compute_advantage(_batch(), adv_estimator=estimator, config=config)
    adv = data.batch["advantages"]
    mask = data.batch["response_mask"]
    assert torch.equal(adv * (1 - mask), torch.zeros_like(adv)), "advantages outside the response"
    assert torch.equal(data.batch["returns"], adv)
    # one value per response, spread over its tokens
    first = adv[:, 0]
    assert torch.allclose(adv, first[:, None] * mask)
    return first


def test_passk_hand_checked_with_shuffled_groups():
    # k = 2, N = 4. Group "b": c = 2, N_neg = 2: R = 1 - C(2,2)/C(4,2) = 5/6, sigma = sqrt(5)/6,
    #   A_pos = (1/6)/sigma = 1/sqrt(5), A_neg = (1/6 - C(1,1)/C(3,1))/sigma = -1/sqrt(5).
    # Group "a": c = 1, N_neg = 3: R = 1 - 3/6 = 1/2, sigma = 1/2, A_pos = 1, A_neg = (1/2 - 2/3)/(1/2) = -1/3.
    adv = _advantages("rlhf_ext_passk", k=2)
    s = 1 / math.sqrt(5)
    expected = [s, -1 / 3, -s, -1 / 3, 1.0, s, -1 / 3, -s]
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)


def test_maxrl_hand_checked():
    # (r - mean)/mean: group "b" mean 1/2 -> +1 / -1; group "a" mean 1/4 -> +3 / -1.
    assert _advantages("rlhf_ext_maxrl").tolist() == pytest.approx([1, -1, -1, -1, 3, 1, -1, -1])


def test_dr_grpo_hand_checked():
    assert _advantages("rlhf_ext_dr_grpo").tolist() == pytest.approx(
        [0.5, -0.25, -0.5, -0.25, 0.75, 0.5, -0.25, -0.5])


@pytest.mark.parametrize("ours, verls", [("rlhf_ext_grpo", "grpo"), ("rlhf_ext_rloo", "rloo")])
def test_estimators_verl_also_has_agree_with_verl(ours, verls):
    # GRPO by hand for group "a" (0, 0, 1, 0): mean 1/4, Bessel std 1/2 -> 1.5 and -0.5.
    a = _advantages(ours)
    b = _advantages(verls)
    assert torch.allclose(a, b, atol=1e-5)
    if verls == "grpo":
        assert a[4].item() == pytest.approx(1.5, abs=1e-5) and a[1].item() == pytest.approx(-0.5, abs=1e-5)


def test_reinforce_pp_baseline_is_whitened_over_response_tokens():
    data = compute_advantage(_batch(), adv_estimator="rlhf_ext_reinforce_pp_baseline", config=OmegaConf.create({}))
    adv, mask = data.batch["advantages"], data.batch["response_mask"].bool()
    tokens = adv[mask]
    assert tokens.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert tokens.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    # before whitening it is r - group mean; whitening is one affine map for all tokens
    centered = torch.tensor([0.5, -0.25, -0.5, -0.25, 0.75, 0.5, -0.25, -0.5])
    per_row = adv[:, 0]
    slope = (per_row[0] - per_row[1]) / (centered[0] - centered[1])
    assert torch.allclose(per_row, per_row[0] + slope * (centered - centered[0]), atol=1e-5)


def test_groups_of_different_sizes_are_estimated_separately():
    # "x" has 3 samples (1, 0, 0), "y" has 2 (1, 1) -- e.g. after a sample was dropped.
    data = _batch(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0]), ["x", "y", "x", "y", "x"], [1, 2, 3, 1, 2])
    out = compute_advantage(data, adv_estimator="rlhf_ext_dr_grpo", config=OmegaConf.create({}))
    assert out.batch["advantages"][:, 0].tolist() == pytest.approx([2 / 3, 0.0, -1 / 3, 0.0, -1 / 3])


def test_bad_options_and_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="no option 'kk'.*it takes: k, eps"):
        _advantages("rlhf_ext_passk", kk=2)
    with pytest.raises(ValueError, match="option k is required"):
        _advantages("rlhf_ext_passk")
    with pytest.raises(ValueError, match="larger than the group size"):
        _advantages("rlhf_ext_passk", k=5)
    with pytest.raises(ValueError, match="maxrl"):
        compute_advantage(_batch(SCORES * 1.2), adv_estimator="rlhf_ext_maxrl", config=OmegaConf.create({}))
    no_uid = DataProto.from_dict(tensors={"token_level_rewards": torch.zeros(2, 1), "response_mask": torch.ones(2, 1)})
    with pytest.raises(ValueError, match="needs verl's 'uid' groups"):
        compute_advantage(no_uid, adv_estimator="rlhf_ext_grpo", config=OmegaConf.create({}))


def test_options_come_from_a_hydra_override_on_verls_algorithm_config():
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=["algorithm.adv_estimator=rlhf_ext_passk", "+algorithm.rlhf_ext.k=2"])
    assert cfg.algorithm.rlhf_ext.k == 2
    data = compute_advantage(_batch(), adv_estimator=cfg.algorithm.adv_estimator, config=cfg.algorithm)
    assert data.batch["advantages"][4, 0].item() == pytest.approx(1.0, abs=1e-5)


# --------------------------------------------------------------------------------------------
# Policy losses through get_policy_loss_fn

OLD = torch.zeros(2, 3)
# ratios: row 0 (A = +1) 1.5, 0.5, 1.0; row 1 (A = -1) 1.1, 0.7, (padding)
LOG_PROB = torch.log(torch.tensor([[1.5, 0.5, 1.0], [1.1, 0.7, 1.0]]))
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
# per token, eps 0.2: row 0: -min(r, clip(r)) = -1.2, -0.5, -1.0; row 1: max(r, clip(r)) = 1.1, 0.8
# sums: row 0 -2.7 (3 tokens), row 1 1.9 (2 tokens); all tokens -0.8 over 5
EXPECTED = {
    "token-mean": -0.8 / 5,
    "token-sum": -0.8,
    "seq-mean-token-sum": -0.8 / 2,
    "seq-mean-token-mean": (-2.7 / 3 + 1.9 / 2) / 2,
    "seq-mean-token-sum-norm": -0.8 / 2 / 3,  # verl's default constant: the padded width T = 3
}


def _actor(loss_mode="rlhf_ext_ppo", **kw) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2,
                       clip_ratio_low=kw.pop("low", 0.2), clip_ratio_high=kw.pop("high", 0.2),
                       policy_loss=PolicyLossConfig(loss_mode=loss_mode), **kw)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_ppo_loss_in_every_verl_aggregation_mode(mode):
    fn = core_algos.get_policy_loss_fn("rlhf_ext_ppo")
    loss, metrics = fn(old_log_prob=OLD, log_prob=LOG_PROB, advantages=ADV, response_mask=MASK, loss_agg_mode=mode,
                       config=_actor(), rollout_is_weights=None)
    assert loss.item() == pytest.approx(EXPECTED[mode], abs=1e-6)
    # same as verl's own clipped loss (dual clip c = 3 does not bind here)
    ref, _ = core_algos.get_policy_loss_fn("vanilla")(OLD, LOG_PROB, ADV, MASK, mode, _actor("vanilla"))
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert metrics["actor/clip_frac_high"] == pytest.approx(1 / 5) and metrics["actor/clip_frac_low"] == pytest.approx(1 / 5)
    assert all(isinstance(v, float) for v in metrics.values())


def test_loss_uses_global_batch_info_scale_factor_clip_higher_dual_clip_and_is_weights():
    fn = core_algos.get_policy_loss_fn("rlhf_ext_ppo")
    cfg = _actor(loss_scale_factor=10)
    loss, _ = fn(OLD, LOG_PROB, ADV, MASK, "seq-mean-token-sum-norm", cfg)
    assert loss.item() == pytest.approx(-0.8 / 2 / 10, abs=1e-6)
    cfg.global_batch_info.update(dp_size=2, batch_num_tokens=20, global_batch_size=8)
    loss, _ = fn(OLD, LOG_PROB, ADV, MASK, "token-mean", cfg)
    assert loss.item() == pytest.approx(-0.8 / 20 * 2, abs=1e-6)
    # clip-higher 0.28: the 1.5 ratio now clips at 1.28
    loss, _ = fn(OLD, LOG_PROB, ADV, MASK, "token-sum", _actor(high=0.28))
    assert loss.item() == pytest.approx(-0.8 - 0.08, abs=1e-6)
    # dual clip: A = -1 with ratio 5 gives max(5, 1.2) = 5, capped at clip_ratio_c = 3
    lp = torch.log(torch.tensor([[5.0]]))
    loss, metrics = fn(torch.zeros(1, 1), lp, -torch.ones(1, 1), torch.ones(1, 1), "token-mean", _actor())
    assert loss.item() == pytest.approx(3.0) and metrics["actor/dual_clip_frac"] == 1.0
    # rollout correction weights multiply the per-token loss
    weights = torch.tensor([[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    loss, _ = fn(OLD, LOG_PROB, ADV, MASK, "token-sum", _actor(), rollout_is_weights=weights)
    assert loss.item() == pytest.approx(-2.4 - 1.0 + 1.9, abs=1e-6)


def test_gspo_hand_checked():
    # one sequence, log ratios 0.2 and 0.0 -> s = exp(0.1); eps 3e-4 / 4e-4, A = +1:
    # loss per token -min(s, clip(s)) = -(1 + 4e-4); seq-mean-token-mean -> the same value
    fn = core_algos.get_policy_loss_fn("rlhf_ext_gspo")
    loss, _ = fn(torch.zeros(1, 2), torch.tensor([[0.2, 0.0]]), torch.ones(1, 2), torch.ones(1, 2),
                 "seq-mean-token-mean", _actor("rlhf_ext_gspo", low=3e-4, high=4e-4))
    assert loss.item() == pytest.approx(-(1 + 4e-4), abs=1e-6)


# --------------------------------------------------------------------------------------------
# KL clamp (a checked patch, only when RLHF_EXT_VERL_KL_CLIP is set)



def test_kl_clamp_default_is_verls(probes):
    out = probes.json("default")["kl"]
    assert out["low_var_kl"][1] == 10.0  # verl's fixed clamp
    assert out["kl"][1] == -30.0 and out["mse"][1] == 450.0


def test_kl_clamp_range_applies_to_every_estimator_in_the_actor_path(probes):
    out = probes.json("kl_range")
    assert out["low_var_kl"] == pytest.approx([0.0, 5.0, math.exp(-3) - 1 + 3])
    assert out["kl"] == [0.0, -2.0, 3.0] and out["mse"] == [0.0, 5.0, 4.5] and out["abs"] == [0.0, 5.0, 3.0]
    assert out["k3+"] == pytest.approx(out["low_var_kl"])  # straight-through keeps the clamped forward value


def test_kl_clamp_none_removes_the_value_clamp_but_keeps_exp_finite():
    # in this process (the variable's parsing and the import hook are covered by the probes)
    from verl.workers.utils import losses

    lp, ref = torch.tensor([[0.0, -30.0, 3.0]]), torch.zeros(1, 3)
    glue.patch_kl(core_algos, "none")
    try:
        k3 = losses.kl_penalty(lp, ref, "low_var_kl")[0]
        # log ratio -30 is bounded to -20 first (exp stays finite), then no value clamp
        assert k3[1].item() == pytest.approx(math.exp(20) - 21, rel=1e-5)
        assert losses.kl_penalty(lp, ref, "kl")[0, 1].item() == -30.0
        assert glue.registered()["kl_clip"] is None
    finally:
        glue.unpatch_kl()
    assert losses.kl_penalty(lp, ref, "low_var_kl")[0, 1].item() == 10.0  # verl's clamp is back


def test_bad_kl_clamp_stops_loudly(probes):
    rc, _, err = probes.raw("kl_bad")
    assert rc != 0
    assert "RLHF_EXT_VERL_KL_CLIP needs LO < HI" in err

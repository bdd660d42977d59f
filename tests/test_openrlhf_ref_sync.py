"""The reference model that follows the policy (rlhf_ext.algorithms.ref_sync, TRL's ``sync_ref_model``) on
OpenRLHF 0.11.2: the mix by hand, the actors' side on real OpenRLHF ``Actor`` models (after a sync the
reference's weights equal ``alpha * policy + (1 - alpha) * reference``), the trainer's schedule, and the flags.
TRL 1.16 parity: tests/verl_env/test_trl_ref_sync.py."""

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms.ref_sync import mix_into_reference, sync_due


def test_mix_hand_computed_and_schedule():
    ref = [("w", torch.tensor([1.0, 2.0])), ("b", torch.tensor([0.0]))]
    out = mix_into_reference(ref, {"w": torch.tensor([3.0, 0.0]), "b": torch.tensor([10.0])}, 0.25)
    assert ref[0][1].tolist() == [1.5, 1.5] and ref[1][1].tolist() == [2.5]  # 0.25 * p + 0.75 * r
    assert out["params"] == 2 and out["max_err"] < 1e-6
    bf16 = [("w", torch.tensor([0.3, -1.7, 5.1], dtype=torch.bfloat16))]
    out = mix_into_reference(bf16, {"w": torch.tensor([0.11, 2.9, -3.3], dtype=torch.bfloat16)}, 0.6)
    assert 0 < out["max_err"] and out["max_err_ulp"] <= 2  # rounded in bf16, within two roundings
    with pytest.raises(ValueError, match="no parameter named 'b'"):
        mix_into_reference([("b", torch.zeros(1))], {"w": torch.zeros(1)}, 0.5)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        mix_into_reference(ref, {"w": torch.zeros(2), "b": torch.zeros(1)}, 0.0)
    assert [s for s in range(0, 9) if sync_due(s, 3)] == [3, 6]


def _actor(seed):
    from openrlhf.models import Actor
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return Actor(Qwen2ForCausalLM(config))


def test_reference_holds_the_mix_after_a_sync_through_openrlhfs_actor_calls(plugin_driver):
    from openrlhf.trainer.ray.launcher import BaseModelActor

    from rlhf_ext.patches.openrlhf.ref_sync import MIX, POLICY_WEIGHTS

    execute_batch = BaseModelActor.execute_batch  # as patched by the plugin
    policy, reference = _actor(0), _actor(1)
    before = {n: p.detach().clone() for n, p in reference.model.named_parameters()}
    policy_side = SimpleNamespace(actor=policy)
    [weights] = execute_batch(policy_side, POLICY_WEIGHTS, {"_": [0]}, 0, 1)
    assert set(weights) == set(before) and all(w.device.type == "cpu" for w in weights.values())
    [result] = execute_batch(SimpleNamespace(model=reference), MIX, {"weights": [weights], "alpha": [0.6]}, 0, 1)
    assert result["max_err"] < 1e-6 and result["max_err_ulp"] <= 2 and result["params"] == len(before)
    for name, p in reference.model.named_parameters():
        expected = 0.6 * dict(policy.model.named_parameters())[name].detach() + 0.4 * before[name]
        torch.testing.assert_close(p.detach(), expected)
    changed = sum(float((p.detach() - before[n]).abs().max()) for n, p in reference.model.named_parameters())
    assert changed > 0


def test_train_step_syncs_on_schedule():
    from rlhf_ext.patches.openrlhf import ref_sync

    calls = []

    def original(self, rollout_samples, global_step):
        return {"policy_loss": 0.0}, global_step + 1

    trainer = SimpleNamespace(reference_model_group=object(), args=SimpleNamespace(rlhf_ext=SimpleNamespace(
        sync_ref_model=True, ref_model_mixup_alpha=0.5, ref_model_sync_steps=2)))
    real_sync = ref_sync.sync
    ref_sync.sync = lambda t, alpha: calls.append(alpha) or {ref_sync.SYNC_KEY: 1.0, ref_sync.ERR_KEY: 0.0}
    try:
        step_fn = ref_sync.make_train_step(original)
        statuses = [step_fn(trainer, [], s)[0] for s in range(4)]  # steps 1..4 after training
    finally:
        ref_sync.sync = real_sync
    assert [s[ref_sync.SYNC_KEY] for s in statuses] == [0.0, 1.0, 0.0, 1.0] and calls == [0.5, 0.5]


@pytest.mark.parametrize("argv, message", [
    (["--rlhf_ext.ref_model_sync_steps", "4"], "add --rlhf_ext.sync_ref_model"),
    (["--rlhf_ext.sync_ref_model", "--rlhf_ext.ref_model_mixup_alpha", "0"], "(0, 1]"),
    (["--rlhf_ext.sync_ref_model", "--algo.kl.init_coef", "0"], "no reference to sync"),
    (["--rlhf_ext.sync_ref_model", "--ds.zero_stage", "3"], "zero_stage 3"),
    (["--rlhf_ext.sync_ref_model", "--ds.lora.rank", "4"], "LoRA"),
])  # fmt: skip
def test_bad_flags_are_argparse_errors(parse, capfd, argv, message):
    from test_openrlhf_staleness import assert_argparse_error

    assert_argparse_error(parse, capfd, argv, message)


def test_resuming_warns_that_the_synced_reference_restarts_from_the_pretrained_weights(parse):
    with pytest.warns(UserWarning, match="reference's synced weights are not in OpenRLHF's checkpoint"):
        args = parse("--rlhf_ext.sync_ref_model", "--ckpt.load_enable")
    assert args.rlhf_ext.sync_ref_model is True


def check_ref_sync_run(metrics_rows, *, every: int):
    """The assertions for a real run with ``--rlhf_ext.sync_ref_model --rlhf_ext.ref_model_sync_steps EVERY``:
    the steps whose count is a multiple of EVERY synced, the others not, and after each sync every reference
    parameter held the mix (its largest distance from ``alpha * policy + (1 - alpha) * ref``, in roundings of
    the parameter dtype, at most 2)."""
    assert metrics_rows, "the run logged no step"
    for row in metrics_rows:
        value = {k[len("train/"):] if k.startswith("train/") else k: v for k, v in row.items()}
        due = sync_due(int(row["step"]), every)
        assert value["rlhf_ext/ref_sync"] == (1.0 if due else 0.0), row
        if due:  # bf16 parameters: the mix rounds twice in the parameter dtype
            assert value["rlhf_ext/ref_sync_max_err_ulp"] <= 2.0 + 1e-6, row

"""rlhf_ext.algorithms.ref_sync.mix_into_reference against TRL 1.16's ``SyncRefModelCallback._sync_target_model``
(the TR-DPO mix-up ``sync_ref_model`` runs), on two small torch models: equal parameters after one and after
several syncs, and TRL's schedule (``global_step % ref_model_sync_steps == 0``)."""

import pytest
import torch

from rlhf_ext.algorithms.ref_sync import mix_into_reference, sync_due


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


@pytest.mark.parametrize("alpha", [0.6, 0.05, 1.0])
def test_mix_equals_trls_sync_target_model(alpha):
    from trl.trainer.callbacks import SyncRefModelCallback

    policy, ref_ours, ref_trl = _model(0), _model(1), _model(1)
    for round_ in range(3):
        with torch.no_grad():
            for p in policy.parameters():  # the policy moves between syncs
                p.add_(0.1 * torch.randn_like(p))
        SyncRefModelCallback._sync_target_model(policy, ref_trl, alpha)
        out = mix_into_reference(ref_ours.named_parameters(), dict(policy.named_parameters()), alpha)
        assert out["max_err"] < 1e-6
        for a, b in zip(ref_ours.parameters(), ref_trl.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)


def test_schedule_equals_trls_callback():
    from types import SimpleNamespace

    from trl.trainer.callbacks import SyncRefModelCallback

    synced = []
    callback = SyncRefModelCallback(ref_model=_model(1), accelerator=None)
    callback.sync_target_model = lambda model, target, alpha: synced.append(step)
    for step in range(1, 13):
        callback.on_step_end(SimpleNamespace(ref_model_sync_steps=4, ref_model_mixup_alpha=0.6),
                             SimpleNamespace(global_step=step), None, model=_model(0))
    assert synced == [s for s in range(1, 13) if sync_due(s, 4)] == [4, 8, 12]

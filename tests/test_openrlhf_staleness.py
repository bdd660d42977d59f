"""AReaL's decoupled PPO and M2PO inside OpenRLHF 0.11.2's actor (rlhf_ext.patches.openrlhf.staleness):
the patched PolicyLoss equals rlhf_ext.algorithms.staleness on OpenRLHF's tensors, the flags parse and fail
early, and ``check_async_staleness_run`` holds the assertions for the mode matrix's async+agent run."""

from types import SimpleNamespace

import pytest
import torch

from rlhf_ext.algorithms import aggregate_loss, get_policy_loss
from rlhf_ext.algorithms.staleness import decoupled_objective, m2po_mask, proximal_log_probs

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# the flags the mode matrix's async+agent run adds (tests/test_e2e_modes.py)
ASYNC_STALENESS_FLAGS = ("--rlhf_ext.decoupled_loss", "--rlhf_ext.prox_logp", "loglinear",
                         "--rlhf_ext.m2po_threshold", "0.00001")  # the CPU run's M2 is ~2e-5: some tokens masked


from test_rollout_correction_openrlhf import actor_module, batch  # noqa: F401,E402 (the fixture and the inputs)


def assert_argparse_error(parse, capfd, argv, message):
    """OpenRLHF's real parser with the plugin ends with exit code 2 and ``message`` on stderr."""
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert message in capfd.readouterr().err


def _args(**flags):
    base = dict(decoupled_loss=False, prox_logp="recompute", behave_imp_weight_cap=None,
                behave_imp_weight_mode="mask", m2po_threshold=None)
    base.update(flags)
    return SimpleNamespace(rlhf_ext=SimpleNamespace(**base))


def _loss(actor_module, loss_type, args):
    from rlhf_ext.patches.openrlhf.policy_loss import registered_call_kwargs
    from rlhf_ext.patches.openrlhf.staleness import configure

    loss_fn = actor_module.PolicyLoss(policy_loss_type=loss_type)
    loss_fn.configure("token-mean")
    configure(loss_fn, args, registered_call_kwargs)
    return loss_fn


@pytest.mark.parametrize("loss_type", ["ppo", "gspo", "cispo"])
def test_decoupled_loss_equals_the_objective(actor_module, loss_type):
    new, old, adv, mask, rollout = batch(1)
    if loss_type == "gspo":
        adv = adv[:, :1].expand_as(adv).contiguous()
    loss_fn = _loss(actor_module, loss_type, _args(decoupled_loss=True, behave_imp_weight_cap="1.5"))
    a = new.clone().requires_grad_()
    loss = loss_fn(a, old, adv, action_mask=mask, rollout_log_probs=rollout)[0]
    b = new.clone().requires_grad_()
    fn = get_policy_loss(loss_type)
    per_token, _ = decoupled_objective(fn, b, old, rollout, adv, mask, cap=1.5, **loss_fn._call_kwargs)
    expected = aggregate_loss(per_token, mask, "token-mean")
    loss.backward()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(a.grad, b.grad)
    plain = aggregate_loss(fn(new, old, adv, mask, **loss_fn._call_kwargs)[0], mask, "token-mean")
    assert not torch.allclose(loss, plain)
    assert 0 < float(loss_fn.last_metrics["decoupled/behave_capped_fraction"]) < 1


def test_loglinear_prox_uses_each_rows_lag(actor_module):
    new, old, adv, mask, rollout = batch(2)
    loss_fn = _loss(actor_module, "ppo", _args(decoupled_loss=True, prox_logp="loglinear"))
    lag = torch.tensor([0.0, 1, 2, 3, 1, 0])
    loss_fn.pending_lag = lag
    loss = loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=rollout)[0]
    prox = proximal_log_probs(rollout, new, -lag, 1, "loglinear")
    # lag L: alpha = L / (L + 1), the proximal policy L/(L+1) of the way from behaviour to current
    torch.testing.assert_close(prox[3], rollout[3] + 0.75 * (new[3] - rollout[3]))
    torch.testing.assert_close(prox[0], rollout[0])
    per_token, _ = decoupled_objective(get_policy_loss("ppo"), new, prox, rollout, adv, mask, cap=5.0,
                                       **loss_fn._call_kwargs)
    torch.testing.assert_close(loss, aggregate_loss(per_token, mask, "token-mean"))
    assert float(loss_fn.last_metrics["decoupled/prox_abs_error"]) > 0
    loss_fn.pending_lag = None
    with pytest.raises(ValueError, match="carries no policy lag"):
        loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=rollout)


@pytest.mark.parametrize("loss_type", ["ppo", "cispo"])
def test_m2po_masks_tokens_for_any_loss(actor_module, loss_type):
    from rlhf_ext.patches.openrlhf.staleness import take_metrics

    new, old, adv, mask, rollout = batch(3)
    loss_fn = _loss(actor_module, loss_type, _args(m2po_threshold=0.05))
    a = new.clone().requires_grad_()
    loss = loss_fn(a, old, adv, action_mask=mask, rollout_log_probs=rollout)[0]
    keep, metrics = m2po_mask(rollout, old, mask, 0.05)
    assert 0 < float(metrics["m2po/masked_fraction"]) < 1
    b = new.clone().requires_grad_()
    per_token, _ = get_policy_loss(loss_type)(b, old, adv, mask, **registered_kwargs(loss_fn, loss_type))
    expected = aggregate_loss(torch.where(keep, per_token, 0.0), mask, "token-mean")
    loss.backward()
    expected.backward()
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(a.grad, b.grad)
    assert a.grad[mask & ~keep].abs().sum() == 0
    assert take_metrics(loss_fn)["m2po/masked_fraction"] == metrics["m2po/masked_fraction"]
    with pytest.raises(ValueError, match="m2po_threshold needs vLLM's log-probs"):
        loss_fn(new, old, adv, action_mask=mask, rollout_log_probs=None)


def registered_kwargs(loss_fn, loss_type):
    from rlhf_ext.patches.openrlhf.policy_loss import flag_options

    return flag_options(get_policy_loss(loss_type), loss_fn.clip_eps_low, loss_fn.clip_eps_high, loss_fn.dual_clip)


def test_micro_batch_pops_the_lag_out_of_the_status(actor_module):
    from rlhf_ext.patches.openrlhf.staleness import LAG_INFO_KEY, attach_lags, micro_batch

    args = _args(decoupled_loss=True, prox_logp="linear")
    samples = [SimpleNamespace(sequences=torch.zeros(2, 3), info={}), SimpleNamespace(sequences=torch.zeros(1, 3),
                                                                                       info={})]
    attach_lags(args, samples, [2, 0])
    assert samples[0].info[LAG_INFO_KEY].tolist() == [2.0, 2.0] and samples[1].info[LAG_INFO_KEY].tolist() == [0.0]
    trainer = SimpleNamespace(actor_loss_fn=_loss(actor_module, "ppo", args))
    with micro_batch(trainer, samples[0]):
        assert trainer.actor_loss_fn.pending_lag.tolist() == [2.0, 2.0]
    assert LAG_INFO_KEY not in samples[0].info and trainer.actor_loss_fn.pending_lag is None
    untouched = [SimpleNamespace(sequences=torch.zeros(1, 3), info={})]
    attach_lags(_args(decoupled_loss=True), untouched, [1])  # recompute: nothing to carry
    assert untouched[0].info == {}


def test_flags_parse_and_request_vllm_log_probs(parse):
    args = parse("--rlhf_ext.decoupled_loss", "--rlhf_ext.behave_imp_weight_cap", "3",
                 "--rlhf_ext.m2po_threshold", "0.04")
    assert args.rlhf_ext.decoupled_loss is True and args.rlhf_ext.m2po_threshold == 0.04
    assert args.rlhf_ext.mismatch_metrics is True


@pytest.mark.parametrize("argv, message", [
    (["--rlhf_ext.prox_logp", "loglinear"], "add --rlhf_ext.decoupled_loss"),
    (["--rlhf_ext.decoupled_loss", "--rlhf_ext.prox_logp", "loglinear"], "only --train.async_enable has"),
    (["--rlhf_ext.decoupled_loss", "--rlhf_ext.behave_imp_weight_cap", "0.5"], "> 1 or 'none'"),
    (["--rlhf_ext.decoupled_loss", "--rlhf_ext.rollout_is", "token"], "weight it twice"),
    (["--rlhf_ext.m2po_threshold", "0"], "finite number > 0"),
    (["--rlhf_ext.m2po_threshold", "0.1", "--rollout.top_p", "0.9"], "top-p-truncated"),
])  # fmt: skip
def test_bad_flags_are_argparse_errors(parse, capfd, argv, message):
    assert_argparse_error(parse, capfd, argv, message)


def check_async_staleness_run(metrics_rows):
    """The assertions for a real ``--train.async_enable`` run with :data:`ASYNC_STALENESS_FLAGS`: every step
    logs the decoupled objective's and M2PO's metrics, finite and in range, and the approximated proximal
    policy is interpolated (its error against OpenRLHF's recomputed one is logged)."""
    assert metrics_rows, "the run logged no step"
    for row in metrics_rows:
        for key in ("decoupled/behave_imp_weight", "decoupled/behave_capped_fraction", "decoupled/prox_abs_error",
                    "decoupled/prox_alpha", "m2po/m2", "m2po/masked_fraction"):
            assert any(k.endswith(key) for k in row), (key, sorted(row))
        value = {k.split("/", 1)[-1] if k.startswith("train/") else k: v for k, v in row.items()}
        assert 0 <= value["m2po/masked_fraction"] < 1
        assert 0 <= value["decoupled/behave_capped_fraction"] <= 1
        assert value["decoupled/behave_imp_weight"] > 0
        assert 0 <= value["decoupled/prox_alpha"] < 1
        assert value["decoupled/prox_abs_error"] >= 0
    assert not any(k.endswith("sample_policy_lag") for row in metrics_rows for k in row)

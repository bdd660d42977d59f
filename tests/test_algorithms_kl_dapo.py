"""KL estimators with clipping, and DAPO's dynamic-sampling and overlong helpers."""

import math

import pytest
import torch

from rlhf_ext.algorithms import available_kl_estimators, get_kl_estimator, kl_estimate, overlong_penalty, zero_variance_groups

T = torch.tensor


def close(a, b, tol=1e-6):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol)


LP = T([[0.0, -1.0, -2.0]])
REF = T([[-0.5, -1.0, -1.0]])  # log ratios: 0.5, 0, -1


def test_kl_estimators_hand_computed():
    assert set(available_kl_estimators()) >= {"k1", "k2", "k3"}
    assert close(get_kl_estimator("k1")(LP, REF), [[0.5, 0.0, -1.0]])
    assert close(get_kl_estimator("k2")(LP, REF), [[0.125, 0.0, 0.5]])
    k3 = [math.exp(-0.5) - 1 + 0.5, 0.0, math.exp(1.0) - 1 - 1.0]
    assert close(get_kl_estimator("k3")(LP, REF), [k3])


def test_k3_nonnegative_and_unbiased():
    torch.manual_seed(0)
    # pi = N(0,1) over a discrete grid vs ref shifted: E_pi[k1] = E_pi[k3] = KL(pi || ref) exactly
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    lp = torch.log_softmax(-0.5 * x**2, 0)
    lref = torch.log_softmax(-0.5 * (x - 0.7) ** 2, 0)
    p = lp.exp()
    exact = (p * (lp - lref)).sum()
    for name in ("k1", "k3"):
        est = (p * get_kl_estimator(name)(lp, lref)).sum()
        assert close(est, exact, tol=1e-9)
    assert (get_kl_estimator("k3")(lp, lref) >= -1e-12).all()


def test_kl_estimate_clipping_and_fraction():
    lp = T([[0.0, 0.0, 0.0, 0.0]])
    ref = T([[-30.0, -3.0, 0.0, 1.0]])  # lr = 30, 3, 0, -1
    kl, m = kl_estimate(lp, ref, "k1", clip=(-0.5, 2.0), log_ratio_clip=20.0)
    assert close(kl, [[2.0, 2.0, 0.0, -0.5]])
    assert close(m["kl_clip_frac"], 3 / 4)
    assert close(m["kl_log_ratio_clip_frac"], 1 / 4)
    kl, m = kl_estimate(lp, ref, "k1", clip=None, log_ratio_clip=None)
    assert close(kl, [[30.0, 3.0, 0.0, -1.0]]) and close(m["kl_clip_frac"], 0.0)
    kl, _ = kl_estimate(lp, ref, "k1", clip="none")
    assert close(kl, [[20.0, 3.0, 0.0, -1.0]])  # only the log-ratio clamp left


def test_kl_estimate_default_matches_openrlhf_clamp():
    lp = T([[0.0, 0.0]])
    ref = T([[15.0, 0.5]])  # lr = -15 -> k3 = e^15 - 16 >> 10
    kl, m = kl_estimate(lp, ref, "k3")
    assert close(kl, [[10.0, math.exp(0.5) - 1 - 0.5]]) and close(m["kl_clip_frac"], 0.5)


def test_kl_estimate_mask_restricts_fraction_and_checks():
    lp = T([[0.0, 0.0]])
    ref = T([[-5.0, float("nan")]])
    kl, m = kl_estimate(lp, ref, "k1", clip=(-1, 1), mask=T([[1, 0]]))
    assert close(m["kl_clip_frac"], 1.0)
    with pytest.raises(ValueError, match="NaN"):
        kl_estimate(lp, ref, "k1")


def test_kl_estimate_gradient_flows_through_unclipped_tokens_only():
    lp = T([[0.0, 0.0]], requires_grad=True)
    kl, _ = kl_estimate(lp, T([[-0.1, -5.0]]), "k2", clip=(-1.0, 1.0))
    kl.sum().backward()
    assert close(lp.grad, [[0.1, 0.0]])


def test_kl_bad_input():
    with pytest.raises(KeyError, match="unknown KL estimator 'k4'.*k1, k2, k3"):
        kl_estimate(LP, REF, "k4")
    with pytest.raises(ValueError, match="lo < hi"):
        kl_estimate(LP, REF, "k1", clip=(1.0, -1.0))
    with pytest.raises(ValueError, match="pair"):
        kl_estimate(LP, REF, "k1", clip=(1.0,))
    with pytest.raises(ValueError, match="shape mismatch"):
        kl_estimate(LP, REF[:, :2], "k1")


# ---- DAPO ---------------------------------------------------------------------------------

def test_zero_variance_groups():
    s = T([[1.0, 1, 1], [0.0, 0, 0], [0.0, 1, 0], [0.5, 0.5, 0.5]])
    assert zero_variance_groups(s).tolist() == [True, True, False, True]
    assert zero_variance_groups(T([[1.0], [0.0]])).tolist() == [True, True]
    with pytest.raises(ValueError, match="NaN"):
        zero_variance_groups(T([[float("nan"), 1.0]]))


def test_overlong_penalty_piecewise():
    # L_max 100, buffer 20: 0 up to 80, linear to -1 at 100, -1 beyond
    p = overlong_penalty(T([0, 80, 81, 90, 100, 150]), max_len=100, buffer_len=20)
    assert close(p, [0.0, 0.0, -0.05, -0.5, -1.0, -1.0])
    assert close(overlong_penalty([90], 100, 20, factor=0.5), [-0.25])


def test_overlong_penalty_bad_input():
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty([1], 100, 0)
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty([1], 100, 200)
    with pytest.raises(ValueError, match="max_len"):
        overlong_penalty([1], 0, 0)
    with pytest.raises(ValueError, match=">= 0"):
        overlong_penalty([-1], 100, 10)


def test_one_kl_clip_rule_for_every_host():
    from rlhf_ext.algorithms import parse_kl_clip
    from rlhf_ext.patches.mindspeed_rl.config import ConfigError, check_kl
    from rlhf_ext.patches.openrlhf.config import normalize_kl_clip
    from rlhf_ext.patches.verl.names import parse_kl_clip as verl_kl_clip

    def mindspeed_kl_clip(value):  # rl_config.kl_clip; unset (None) keeps MindSpeed-RL's, "none" is ()
        return check_kl("k3", value)

    for off in (None, "none", " NONE ", ["none"]):
        assert parse_kl_clip(off) is None
    assert parse_kl_clip(["-1", 2]) == (-1.0, 2.0) and parse_kl_clip((-1, 2)) == (-1.0, 2.0)
    assert parse_kl_clip("-1,2", split_text=True) == parse_kl_clip("-1 2", split_text=True) == (-1.0, 2.0)
    with pytest.raises(ValueError, match="pair"):
        parse_kl_clip("-1,2")  # one string is one value unless the setting is a text (an env variable)
    with pytest.raises(ValueError, match="lo < hi"):
        parse_kl_clip([float("nan"), 1.0])
    # each host names its own setting, the rule is the same
    for bad, words in (([2, 1], "LO < HI"), (["a", "b"], "two numbers"), ([1, 2, 3], "pair")):
        for parse, name in ((normalize_kl_clip, "--algo.kl.clip"), (verl_kl_clip, "RLHF_EXT_VERL_KL_CLIP"),
                            (parse_kl_clip, "KL clip"), (mindspeed_kl_clip, "rl_config.kl_clip")):
            value = ",".join(map(str, bad)) if parse is verl_kl_clip else bad
            with pytest.raises(ValueError, match=name) as info:
                parse(value)
            assert words.lower() in str(info.value).lower()
    with pytest.raises(ConfigError):  # MindSpeed-RL's config error is a ValueError with the same message
        mindspeed_kl_clip([2, 1])
    assert mindspeed_kl_clip(None) is None and mindspeed_kl_clip("none") == mindspeed_kl_clip(["none"]) == ()
    assert mindspeed_kl_clip(["-1", 2]) == parse_kl_clip(["-1", 2])

"""One release rule for every host (rlhf_ext.seams.host): the three hosts' refusals say what each
said when it had its own copy, the version is read once, the override lets any release through,
and a host's registry functions are reachable at module level."""

import pytest

from rlhf_ext.seams.host import REGISTRY_FUNCTIONS, HostRelease, distribution_version
from rlhf_ext.seams.table import PatchRegistry


def _hosts():
    from rlhf_ext.patches.mindspeed_rl import compat as mindspeed_rl
    from rlhf_ext.patches.openrlhf import compat as openrlhf
    from rlhf_ext.patches import verl

    return openrlhf, mindspeed_rl, verl


def test_each_host_refuses_an_unsupported_release_in_its_own_words(monkeypatch):
    openrlhf, mindspeed_rl, verl = _hosts()
    for env in ("RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF", "RLHF_EXT_ALLOW_UNSUPPORTED_MINDSPEED_RL",
                "RLHF_EXT_ALLOW_UNSUPPORTED_VERL"):
        monkeypatch.delenv(env, raising=False)
    expected = {
        openrlhf: (openrlhf.OpenRLHFCompatibilityError, "0.12.0",
                   "rlhf_ext supports OpenRLHF 0.11.x, but OpenRLHF 0.12.0 is installed; install openrlhf==0.11.2, "
                   "or set RLHF_EXT_ALLOW_UNSUPPORTED_OPENRLHF=1 to try anyway (every patch still checks the "
                   "signatures it needs)"),
        mindspeed_rl: (mindspeed_rl.MindSpeedRLCompatibilityError, "2.2.0",
                       "rlhf_ext supports MindSpeed-RL 2.1.x (commit 05a90d77), but MindSpeed-RL 2.2.0 is in use; "
                       "set RLHF_EXT_ALLOW_UNSUPPORTED_MINDSPEED_RL=1 to try anyway (every patch still checks the "
                       "signatures it needs)"),
        verl: (verl.VerlCompatibilityError, "0.10.0",
               "rlhf_ext supports verl 0.9.x, but verl 0.10.0 is installed; install verl==0.9.1, or set "
               "RLHF_EXT_ALLOW_UNSUPPORTED_VERL=1 to try anyway (the seam checks still run)"),
    }
    for host, (error, version, message) in expected.items():
        with pytest.raises(error) as info:
            host.check_version(version)
        assert str(info.value) == message
    assert openrlhf.check_version("0.11.7") == "0.11.7" and verl.check_version("0.9.1") == "0.9.1"
    assert mindspeed_rl.check_version("2.1.0") == "2.1.0"
    monkeypatch.setenv("RLHF_EXT_ALLOW_UNSUPPORTED_VERL", "1")
    assert verl.check_version("0.10.0") == "0.10.0"
    monkeypatch.setenv("RLHF_EXT_ALLOW_UNSUPPORTED_VERL", "0")  # "0" is no override
    with pytest.raises(verl.VerlCompatibilityError):
        verl.check_version("0.10.0")


def test_the_version_is_read_once_and_a_missing_one_is_named():
    reads = []

    class Refused(RuntimeError):
        pass

    def read():
        reads.append(1)
        return None

    release = HostRelease("Host", ((1, 2),), "1.2.x", "RLHF_EXT_TEST_ALLOW_HOST", Refused, read_version=read,
                          missing="unknown (nothing says)")
    assert release.version() == release.version() == "unknown (nothing says)" and len(reads) == 1
    with pytest.raises(Refused, match=r"but Host unknown \(nothing says\) is installed; set RLHF_EXT_TEST_ALLOW_HOST=1"):
        release.check()
    installed = HostRelease("pytest", ((0, 0),), "0.0.x", "RLHF_EXT_TEST_ALLOW_HOST", Refused, distribution="pytest")
    assert installed.version() == distribution_version("pytest") == pytest.__version__
    absent = HostRelease("Nope", ((0, 0),), "0.0.x", "RLHF_EXT_TEST_ALLOW_HOST", Refused,
                         distribution="rlhf-ext-no-such-dist")
    assert absent.version() == "unknown (no 'rlhf-ext-no-such-dist' distribution metadata)"
    with pytest.raises(ValueError, match="needs a distribution name or a read_version"):
        HostRelease("Nope", ((0, 0),), "0.0.x", "X", Refused)


def test_a_hosts_registry_functions_are_its_registrys():
    openrlhf, mindspeed_rl, _ = _hosts()
    for compat in (openrlhf, mindspeed_rl):
        registry = compat.register.__self__
        assert isinstance(registry, PatchRegistry) and registry.error is compat.RELEASE.error
        for name in REGISTRY_FUNCTIONS:
            assert getattr(compat, name) == getattr(registry, name), name
        assert compat._registry is registry._registry and compat._applied_modules is registry._applied_modules
        with pytest.raises(AttributeError, match=f"module '{compat.__name__}' has no attribute 'regster'"):
            compat.regster  # noqa: B018
    assert openrlhf.register.__self__ is not mindspeed_rl.register.__self__  # two hosts never share patches

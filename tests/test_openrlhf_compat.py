"""Version guard and all-or-nothing patching."""

import os
import subprocess
import sys
import types

import pytest

from rlhf_ext.patches.openrlhf import compat
from rlhf_ext.patches.openrlhf.compat import OpenRLHFCompatibilityError, Patch, Requirement


def test_supported_versions():
    assert compat.check_version("0.11.2") == "0.11.2"
    assert compat.check_version("0.11.0rc1") == "0.11.0rc1"
    assert compat.openrlhf_version() == "0.11.2"  # the one CI installs
    for bad in ("0.10.2", "0.12.0", "1.0", "garbage"):
        with pytest.raises(OpenRLHFCompatibilityError, match=f"supports OpenRLHF 0.11.x, but OpenRLHF {bad} is installed"):
            compat.check_version(bad)


def test_override_for_unsupported_versions(monkeypatch):
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "1")
    assert compat.check_version("0.12.0") == "0.12.0"


@pytest.fixture()
def fake_module():
    module = types.ModuleType("rlhf_ext_test_fake_target")

    class Maker:
        def compute(self, experiences):
            return "original compute"

        def other(self, a, b):
            return "original other"

    def helper(x, y=1):
        return "original helper"

    module.Maker, module.helper = Maker, helper
    yield module
    compat._registry.pop(module.__name__, None)
    compat._applied_modules.pop(module.__name__, None)


def _wrap(original, module):
    return lambda *a, **k: "patched"


def test_a_mismatch_patches_nothing_and_names_version_and_patch(fake_module):
    compat.register(Patch("good one", fake_module.__name__, "Maker.compute", ("self", "experiences"), _wrap))
    compat.register(Patch("helper one", fake_module.__name__, "helper", ("x",), _wrap))  # y is missing
    compat.register(
        Patch("needs more", fake_module.__name__, "Maker.other", ("self", "a", "b"), _wrap,
              requires=(Requirement("Maker.gone", None),))
    )  # fmt: skip
    with pytest.raises(OpenRLHFCompatibilityError) as exc:
        compat.apply_module(fake_module)
    message = str(exc.value)
    assert "OpenRLHF 0.11.2" in message and "nothing in that module was changed" in message
    assert "patch 'helper one'" in message and "has parameters (x, y), expected (x)" in message
    assert "patch 'needs more'" in message and "Maker.gone does not exist" in message
    assert "good one" not in message
    assert fake_module.Maker().compute([]) == "original compute"
    assert fake_module.helper(1) == "original helper"


def test_matching_patches_apply_together_and_undo(fake_module):
    compat.register(Patch("good one", fake_module.__name__, "Maker.compute", ("self", "experiences"), _wrap))
    compat.register(Patch("helper one", fake_module.__name__, "helper", ("x", "y"), _wrap))
    assert compat.apply_module(fake_module) == ["good one", "helper one"]
    assert fake_module.Maker().compute([]) == "patched" and fake_module.helper(1) == "patched"
    assert compat.is_patched(fake_module.helper)
    assert compat.original(fake_module, "helper")(1) == "original helper"
    compat.apply_module(fake_module)  # idempotent
    compat.undo_all()
    assert fake_module.Maker().compute([]) == "original compute" and fake_module.helper(1) == "original helper"


def test_every_patch_matches_the_installed_openrlhf():
    import importlib

    from rlhf_ext.patches import install_flash_attn_fallback
    from rlhf_ext.patches.openrlhf import PATCHES

    install_flash_attn_fallback()  # CPU: openrlhf.models needs the flash_attn names

    assert {p.module for p in PATCHES} == set(compat.patch_modules())
    for name in compat.patch_modules():
        assert compat.check_module(importlib.import_module(name)) == []


def test_driver_refuses_an_unsupported_openrlhf_at_start_up(tmp_path):
    # An OpenRLHF that reports another version (its metadata found first on sys.path).
    dist = tmp_path / "openrlhf-0.10.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openrlhf\nVersion: 0.10.0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLHF_EXT_")}
    env["PYTHONPATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-m", "openrlhf.cli.train_ppo_ray", "--plugin", "rlhf_ext", "--help"],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert out.returncode == 2
    assert "rlhf_ext supports OpenRLHF 0.11.x, but OpenRLHF 0.10.0 is installed" in out.stderr
    assert out.stdout == ""


def test_driver_exits_cleanly_on_a_mismatch(fake_module, capsys):
    from rlhf_ext.patches.openrlhf import _apply_or_exit

    compat.register(Patch("helper one", fake_module.__name__, "helper", ("x",), _wrap))
    with pytest.raises(SystemExit) as exc:
        _apply_or_exit(fake_module)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhf_ext: error: rlhf_ext cannot patch OpenRLHF 0.11.2") and "patch 'helper one'" in err
    assert fake_module.helper(1) == "original helper"

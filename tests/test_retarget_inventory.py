"""Every CUDA-specific site of the installed OpenRLHF is retargeted or allowlisted with a reason;
a release that adds, moves or drops one fails loudly. Also the retarget's version/signature guard."""

import types

import pytest

from rlhf_ext.patches.retarget import RetargetError, check_inventory, scan_openrlhf
from rlhf_ext.patches.retarget.guard import TESTED_OPENRLHF_VERSIONS, openrlhf_version, require
from rlhf_ext.patches.retarget.inventory import Site, main, scan_source
from rlhf_ext.patches.retarget.sites import KNOWN_SITES, PATTERNS, KnownSite, covered_torch_cuda_names


@pytest.fixture(scope="module")
def sites():
    return scan_openrlhf()


def test_installed_openrlhf_is_fully_accounted_for(sites):
    report = check_inventory(sites)
    assert report.ok, report.describe()
    kinds = {site.kind for site in sites}
    # The scan must actually see each kind of site the issue names, or it is not looking.
    assert kinds == set(PATTERNS), kinds
    assert len(sites) > 80


def test_every_entry_says_how_or_why():
    for entry in KNOWN_SITES:
        text = entry.handled_by or entry.reason
        assert len(text) > 20, entry


def test_torch_cuda_calls_all_covered_by_both_shims(sites):
    names = {name for site in sites if site.kind == "torch.cuda" for name in site.names}
    assert {"current_device", "empty_cache", "synchronize", "set_device", "current_stream"} <= names
    assert names <= covered_torch_cuda_names()


def test_a_new_site_fails_loudly(sites):
    new = Site("trainer/ray/launcher.py", 999, '"GPU"', 'bundles = [{"GPU": 2}]')
    report = check_inventory(sites + [new])
    assert not report.ok
    # It joins the launcher's bundle entry, whose count no longer matches.
    assert "expected 1 line(s) of openrlhf/trainer/ray/launcher.py" in report.describe()
    brand_new = Site("trainer/new_module.py", 3, "nccl", 'dist.init_process_group("nccl")')
    report = check_inventory(sites + [brand_new])
    assert report.unknown == [brand_new]
    assert "new site: openrlhf/trainer/new_module.py:3 [nccl]" in report.describe()


def test_a_vanished_site_fails_loudly(sites):
    remaining = [s for s in sites if not (s.path == "models/utils.py" and s.kind == "torch.compile")]
    report = check_inventory(remaining)
    assert [entry.kind for entry, found in report.miscounted] == ["torch.compile"]


def test_an_uncovered_torch_cuda_call_fails_loudly(sites):
    odd = Site("trainer/x.py", 1, "torch.cuda", "torch.cuda.nvtx.range_push('x')", ("nvtx",))
    report = check_inventory(sites + [odd])
    assert report.uncovered_cuda_calls == [odd]


def test_scan_ignores_comments_and_docstrings():
    source = '''"""Module doc mentions torch.cuda.foo and "cuda"."""
def f():
    """num_gpus in a docstring"""
    x = 1  # torch.cuda.synchronize() in a comment
    return torch.cuda.current_device(), "GPU"
'''
    found = scan_source("m.py", source)
    assert [(s.line, s.kind) for s in found] == [(5, "torch.cuda"), (5, '"GPU"')]
    assert found[0].names == ("current_device",)


def test_known_site_needs_exactly_one_justification():
    with pytest.raises(ValueError, match="exactly one"):
        KnownSite("a.py", "nccl", "x", 1)
    with pytest.raises(ValueError, match="exactly one"):
        KnownSite("a.py", "nccl", "x", 1, handled_by="h", reason="r")
    with pytest.raises(ValueError, match="unknown pattern kind"):
        KnownSite("a.py", "nvtx", "x", 1, reason="r")


def test_cli_reports(capsys):
    assert main([]) == 0
    assert "retargeted or allowlisted" in capsys.readouterr().out


def test_guard_names_version_and_patch():
    module = types.ModuleType("openrlhf.fake")
    module.f = lambda a, b: None
    assert require(module, "f", "demo patch", params=["a"]) is module.f
    with pytest.raises(RetargetError) as missing:
        require(module, "g", "demo patch")
    message = str(missing.value)
    assert "'demo patch'" in message and "openrlhf.fake.g does not exist" in message
    assert openrlhf_version() in message and TESTED_OPENRLHF_VERSIONS[0] in message
    with pytest.raises(RetargetError, match=r"has no parameter\(s\) c"):
        require(module, "f", "demo patch", params=["a", "c"])


def test_guard_finds_the_class_behind_a_ray_actor():
    import ray

    from rlhf_ext.patches.retarget.guard import ray_actor_class_body

    class Worker:
        def configure(self, backend, bundle_indices):
            return backend

    body = ray_actor_class_body(ray.remote(num_gpus=1)(Worker), "demo")
    assert body is Worker
    assert require(body, "configure", "demo", params=["backend", "bundle_indices"]) is Worker.configure
    with pytest.raises(RetargetError, match="not a Ray actor class"):
        ray_actor_class_body(Worker, "demo")

"""The package's layering, read from the source: which rlhf_ext module imports which.

Every ``import`` counts, at module level or inside a function (a function-level import is still a
dependency; it only defers the cycle to run time). A package importing its own submodules, and a
submodule importing its package's ``__init__``, is the usual public-API pattern and is not counted
as a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import pytest

import rlhf_ext

ROOT = Path(rlhf_ext.__file__).resolve().parent
FRAMEWORKS = ("openrlhf", "verl", "mindspeed_rl", "megatron", "ray", "vllm", "deepspeed", "torch_npu")


def _module_files() -> Dict[str, Path]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _module_files()


def _resolve(name: str) -> str:
    """The rlhf_ext module ``name`` lives in (a name imported from a package resolves to the package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, path: Path) -> Set[str]:
    """Every absolute name ``module`` imports: modules, and ``package.name`` for ``from package import name``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


IMPORTS = {module: _imports(module, path) for module, path in MODULES.items()}


def _internal_deps(module: str) -> Set[str]:
    deps = {_resolve(name) for name in IMPORTS[module] if name.split(".")[0] == "rlhf_ext"}
    return {dep for dep in deps if dep and dep != module}


def _related(a: str, b: str) -> bool:
    return a.startswith(b + ".") or b.startswith(a + ".")


GRAPH = {module: {dep for dep in _internal_deps(module) if not _related(module, dep)} for module in MODULES}


def _cycles() -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    return found


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _importers_of(package: str, among: str = "rlhf_ext") -> Dict[str, List[str]]:
    return {
        module: sorted(dep for dep in GRAPH[module] if _under(dep, package))
        for module in MODULES
        if _under(module, among) and not _under(module, package) and any(_under(d, package) for d in GRAPH[module])
    }


def test_the_source_walk_sees_the_package():
    # the checks below are vacuous if the walk finds nothing; these edges exist by design
    assert len(MODULES) > 100
    assert "rlhf_ext.seams.import_hooks" in GRAPH["rlhf_ext.patches.openrlhf"]
    assert "rlhf_ext.patches.retarget.sites" in GRAPH["rlhf_ext.patches.retarget.inventory"]
    assert "rlhf_ext.tours.smoke" in GRAPH["rlhf_ext.cli"]  # a function-level import


def test_cycle_detection_finds_a_planted_cycle():
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    saved = dict(GRAPH)
    try:
        GRAPH.clear()
        GRAPH.update(planted)
        assert _cycles() == [["a", "b", "c"]]
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def test_no_two_modules_depend_on_each_other():
    assert _cycles() == []


def test_npu_never_imports_patches():
    assert _importers_of("rlhf_ext.patches", among="rlhf_ext.npu") == {}


HOSTS = ("rlhf_ext.patches.openrlhf", "rlhf_ext.patches.mindspeed_rl", "rlhf_ext.patches.verl")


@pytest.mark.parametrize("host", HOSTS)
def test_no_host_package_imports_another_hosts(host):
    """A fourth host is a package beside the others; what two hosts share lives below them
    (``rlhf_ext.seams``) or in the activation room (the Ray carriage), never in one of them."""
    for other in HOSTS:
        if other != host:
            assert _importers_of(other, among=host) == {}, other


@pytest.mark.parametrize("host", HOSTS)
def test_hosts_reach_into_activation_only_for_the_ray_carriage(host):
    """Activation sits above the hosts (it picks which to activate); a host uses only its Ray
    environment carriage, which imports nothing of rlhf_ext."""
    reached = {dep for deps in _importers_of("rlhf_ext.patches.activation", among=host).values() for dep in deps}
    assert reached <= {"rlhf_ext.patches.activation.ray_env"}, reached
    assert GRAPH["rlhf_ext.patches.activation.ray_env"] == set()


def test_the_seam_tools_stand_on_the_ground_floor():
    """Post-import hooks, the replacement ledger, the patch table and the host release rule import
    nothing of rlhf_ext outside their own package (the device shims and every host use them)."""
    modules = [m for m in MODULES if _under(m, "rlhf_ext.seams")]
    assert {"rlhf_ext.seams.import_hooks", "rlhf_ext.seams.ledger", "rlhf_ext.seams.table",
            "rlhf_ext.seams.host"} <= set(modules)  # fmt: skip
    for module in modules:
        assert {dep for dep in GRAPH[module] if not _under(dep, "rlhf_ext.seams")} == set(), module


@pytest.mark.parametrize("package", ["rlhf_ext.algorithms", "rlhf_ext.rewards"])
def test_framework_free_math_stays_framework_free(package):
    glue = ("rlhf_ext.patches", "rlhf_ext.evalkit", "rlhf_ext.queue", "rlhf_ext.report", "rlhf_ext.tours",
            "rlhf_ext.cli")  # fmt: skip
    for layer in glue:
        assert _importers_of(layer, among=package) == {}, layer
    for module in MODULES:
        if _under(module, package):
            frameworks = sorted(n for n in IMPORTS[module] if n.split(".")[0] in FRAMEWORKS)
            assert frameworks == [], module


def test_only_the_cli_imports_the_tours():
    importers = _importers_of("rlhf_ext.tours")
    assert set(importers) == {"rlhf_ext.cli"}, importers


def test_every_import_of_an_rlhf_ext_module_names_one_that_exists():
    """Imports inside functions run only when their code path does: a module moved without them
    (``from .queue import`` left in a file that moved one package down) fails only there, late."""
    missing = []
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] == "rlhf_ext" and base not in MODULES:
                    missing.append(f"{module}:{node.lineno} imports {base}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "rlhf_ext" and alias.name not in MODULES:
                        missing.append(f"{module}:{node.lineno} imports {alias.name}")
    assert not missing, missing


def test_nothing_imports_the_cli_from_below():
    """The ``rlhf-ext`` command is the top floor: tools it dispatches to (``alignment``, ``data.cli``)
    take shared pieces such as the argument types from below (``rlhf_ext.ground.argtypes``), never from it."""
    assert _importers_of("rlhf_ext.cli") == {}


def test_no_tool_imports_the_host_glue():
    """Host glue is loaded by the hosts (entry points, start-up hooks); a tool that imported it would
    drag a training framework into a command that needs none."""
    assert _importers_of("rlhf_ext.patches") == {}


GROUND = sorted(m for m in MODULES if _under(m, "rlhf_ext.ground"))


def test_the_ground_floor_is_the_ground_package():
    # the rule below is vacuous if the walk finds no ground package
    assert {"rlhf_ext.ground.registry", "rlhf_ext.ground.jsonfiles", "rlhf_ext.ground.argtypes",
            "rlhf_ext.ground.supervision"} <= set(GROUND)  # fmt: skip


@pytest.mark.parametrize("module", GROUND)
def test_the_ground_floor_stands_alone(module):
    assert {dep for dep in GRAPH[module] if not _under(dep, "rlhf_ext.ground")} == set(), module


def test_the_run_record_stands_on_the_ground_floor():
    """``rlhf_ext.runs`` (the run-record format, its reading, status, check, throughput and MFU) is
    framework-free and imports of rlhf_ext only the ground floor: the report, the queue, evalkit and
    every host's glue read and write run records through it."""
    modules = [m for m in MODULES if _under(m, "rlhf_ext.runs")]
    assert {"rlhf_ext.runs.throughput", "rlhf_ext.runs.flops", "rlhf_ext.runs.check"} <= set(modules)
    for module in modules:
        outside = {d for d in GRAPH[module] if not (_under(d, "rlhf_ext.ground") or _under(d, "rlhf_ext.runs"))}
        assert outside == set(), module
        assert sorted(n for n in IMPORTS[module] if n.split(".")[0] in FRAMEWORKS) == [], module

"""Find every CUDA-specific site in the installed OpenRLHF and check each is retargeted or allowlisted.

A *site* is one line of OpenRLHF code (comments and docstrings excluded) matching one of
:data:`~rlhf_ext.patches.retarget.sites.PATTERNS`. :data:`~rlhf_ext.patches.retarget.sites.KNOWN_SITES`
says, per file and pattern, which lines the retarget handles (and how) and which are allowlisted
(and why), with the number of lines expected; ``torch.cuda.<name>`` calls are handled as a class
when both device shims answer for ``<name>``. A new OpenRLHF release that adds, removes or moves a site makes
:func:`check_inventory` report it, so the retarget is revisited before it silently misses a spot.

Run ``python -m rlhf_ext.patches.retarget`` to print the report for the installed OpenRLHF.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from rlhf_ext.patches.retarget import sites as site_table
from rlhf_ext.patches.retarget.sites import PATTERNS, KnownSite


@dataclass(frozen=True)
class Site:
    """One matching line of OpenRLHF source."""

    path: str  # relative to the openrlhf package directory, with "/" separators
    line: int
    kind: str  # a key of PATTERNS
    text: str  # the code on that line, comments removed
    names: Tuple[str, ...] = ()  # for "torch.cuda": the attribute names called

    def __str__(self) -> str:
        return f"openrlhf/{self.path}:{self.line} [{self.kind}] {self.text.strip()}"


@dataclass
class InventoryReport:
    sites: List[Site]
    unknown: List[Site] = field(default_factory=list)  # matched by no known entry
    miscounted: List[Tuple[KnownSite, List[Site]]] = field(default_factory=list)  # count changed (0 = stale entry)
    uncovered_cuda_calls: List[Site] = field(default_factory=list)  # torch.cuda.<name> no shim answers for

    @property
    def ok(self) -> bool:
        return not (self.unknown or self.miscounted or self.uncovered_cuda_calls)

    def describe(self) -> str:
        if self.ok:
            return f"all {len(self.sites)} CUDA-specific sites in OpenRLHF are retargeted or allowlisted"
        lines = ["OpenRLHF has CUDA-specific sites the NPU/CPU retarget does not account for:"]
        for site in self.uncovered_cuda_calls:
            lines.append(f"  torch.cuda call no device shim covers: {site}")
        for site in self.unknown:
            lines.append(f"  new site: {site}")
        for entry, found in self.miscounted:
            lines.append(
                f"  expected {entry.count} line(s) of openrlhf/{entry.path} [{entry.kind}] containing "
                f"{entry.contains!r}, found {len(found)}" + "".join(f"\n      {s}" for s in found)
            )
        lines.append(
            "Handle each in rlhf_ext/patches/retarget (and add it to sites.KNOWN_SITES with handled_by), "
            "or allowlist it there with the reason it is safe on NPU and CPU."
        )
        return "\n".join(lines)


def openrlhf_root() -> str:
    """Directory of the installed ``openrlhf`` package (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("OpenRLHF is not installed: pip install --no-deps openrlhf==0.11.2 (see README)")
    return list(spec.submodule_search_locations)[0]


def _code_lines(source: str) -> List[str]:
    """The source's lines with comments and docstrings blanked out (line numbers preserved)."""
    lines = source.splitlines()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                row, col = tok.start
                lines[row - 1] = lines[row - 1][:col]
    except (tokenize.TokenError, IndentationError):
        pass
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return lines
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for row in range(first.lineno, (first.end_lineno or first.lineno) + 1):
                    lines[row - 1] = ""
    return lines


def scan_source(path: str, source: str) -> List[Site]:
    sites = []
    for number, text in enumerate(_code_lines(source), start=1):
        for kind, pattern in PATTERNS.items():
            matches = pattern.findall(text)
            if not matches:
                continue
            names = tuple(matches) if kind == "torch.cuda" else ()
            sites.append(Site(path, number, kind, text, names))
    return sites


def scan_openrlhf(root: Optional[str] = None) -> List[Site]:
    """Every site in the installed OpenRLHF's ``.py`` files, ordered by file and line."""
    root = root or openrlhf_root()
    sites: List[Site] = []
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            full = os.path.join(directory, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            with open(full, encoding="utf-8") as handle:
                sites.extend(scan_source(rel, handle.read()))
    return sorted(sites, key=lambda s: (s.path, s.line, s.kind))


def check_inventory(
    sites: Optional[Iterable[Site]] = None,
    known: Optional[Iterable[KnownSite]] = None,
    covered_cuda_names: Optional[Iterable[str]] = None,
) -> InventoryReport:
    """Match ``sites`` (the installed OpenRLHF's by default) against ``known`` entries."""
    sites = list(scan_openrlhf() if sites is None else sites)
    known = list(site_table.KNOWN_SITES if known is None else known)
    covered = set(site_table.covered_torch_cuda_names() if covered_cuda_names is None else covered_cuda_names)
    report = InventoryReport(sites=sites)
    claimed: Dict[KnownSite, List[Site]] = defaultdict(list)
    for site in sites:
        if site.kind == "torch.cuda":
            missing = [name for name in site.names if name not in covered]
            if missing:
                report.uncovered_cuda_calls.append(site)
            continue
        entry = next(
            (k for k in known if k.path == site.path and k.kind == site.kind and k.contains in site.text), None
        )
        if entry is None:
            report.unknown.append(site)
        else:
            claimed[entry].append(site)
    for entry in known:
        found = claimed.get(entry, [])
        if len(found) != entry.count:
            report.miscounted.append((entry, found))
    return report


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m rlhf_ext.patches.retarget",
        description="List OpenRLHF's CUDA-specific sites and check the NPU/CPU retarget accounts for each.",
    )
    parser.add_argument("--root", help="openrlhf package directory (default: the installed one)")
    parser.add_argument("--list", action="store_true", help="print every site, not only problems")
    args = parser.parse_args(argv)
    sites = scan_openrlhf(args.root)
    report = check_inventory(sites)
    if args.list:
        for site in sites:
            print(site)
    print(report.describe())
    return 0 if report.ok else 1

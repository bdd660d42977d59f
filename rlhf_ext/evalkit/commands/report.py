"""``evalkit report RUN_DIR``: recompute and print the summary of a run directory from its samples."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true", help="print summary JSON instead of Markdown")


def run(args: argparse.Namespace) -> int:
    from ..summary import render_markdown, report

    summary = report(args.run_dir)
    print(json.dumps(summary, indent=2) if args.json else render_markdown(summary))
    return 0

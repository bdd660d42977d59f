"""rlhf_ext's grader on math-verify's own regression suite: where it is worse (and better) than math-verify.

Usage (from the repository root; the suite comes from a checkout of huggingface/Math-Verify, e.g.
the one the ``fetch`` tool or ``git clone`` brings)::

    .venv/bin/python benchmarks/math_verify_suite.py --math-verify-repo PATH [--json out.json] [--show N]

The suite is the ``(gold, pred, expected)`` rows of the parametrized tests in math-verify's
``tests/test_all.py``, ``test_numina_cases.py``, ``test_open_thoughts.py`` and ``test_boxed.py``
(rows read with ``ast.literal_eval`` from the test source; of ``test_set_rel_assymetry`` only the
rows with ``allow_set_relation_comp=True``, the comparison rlhf_ext always makes: the others pin
what math-verify's flag switches off). math-verify's verdict is computed as its test calls it
(``parse`` with the test's ``match_types``, ``verify(float_rounding=precision, strict=True)``); ours
is the worker's exact code (``grade_response`` on ``prepare_gold(gold)``) in both modes. A row is
*worse* when math-verify matches the expected verdict and we do not, *better* when the reverse; a
reward-mode row worse only because the response states no anchor (evaluation mode gets it right) is
counted apart: rewards require the format. The gold is the suite's own text (often ``$...$`` or a
bare answer). Only the suite's fixed strings are parsed (``ExprExtractionConfig`` runs sympy's
parser on them).
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import subprocess
import sys

SUITE_FILES = ("tests/test_all.py", "tests/test_numina_cases.py", "tests/test_open_thoughts.py", "tests/test_boxed.py")


def _source(repo: str, path: str) -> str:
    full = os.path.join(repo, path)
    if os.path.exists(full):
        with open(full) as f:
            return f.read()
    # a bare git directory (a mirror) has no work tree: read the file from HEAD
    return subprocess.run(["git", "--git-dir", repo, "show", f"HEAD:{path}"], capture_output=True, text=True,
                          check=True).stdout


def _call_kwargs(func: ast.FunctionDef) -> dict:
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compare_strings":
            out = {}
            for kw in node.keywords:
                try:
                    out[kw.arg] = ast.literal_eval(kw.value)
                except ValueError:
                    out[kw.arg] = ast.unparse(kw.value)  # a test parameter, named
            return out
    return {}


def suite_rows(repo: str):
    """[(test, gold, pred, expected, match_types, precision, allow_set_relation_comp)] from the suite's
    parametrized tests."""
    rows = []
    for path in SUITE_FILES:
        tree = ast.parse(_source(repo, path))
        for func in tree.body:
            if not isinstance(func, ast.FunctionDef):
                continue
            kwargs = _call_kwargs(func)
            for dec in func.decorator_list:
                if not (isinstance(dec, ast.Call) and ast.unparse(dec.func).endswith("parametrize")):
                    continue
                names = [n.strip() for n in ast.literal_eval(dec.args[0]).split(",")]
                if names[:3] != ["gold", "pred", "expected"]:
                    continue
                for node in dec.args[1].elts:
                    try:
                        values = ast.literal_eval(node)
                    except ValueError:
                        continue  # a row built by code (an f-string): not a fixed case
                    row = dict(zip(names, values))
                    if row.get("allow_set_relation_comp") is False:
                        continue
                    precision = row.get("precision", kwargs.get("precision", 6))
                    if not isinstance(precision, int):
                        precision = 6
                    rows.append((f"{os.path.basename(path)}::{func.name}", row["gold"], row["pred"],
                                 bool(row["expected"]), kwargs.get("match_types", ["latex", "expr"]), precision,
                                 bool(row.get("allow_set_relation_comp", False))))
    return rows


def math_verify_verdict(gold: str, pred: str, match_types, precision: int, set_relation: bool = False) -> bool:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0) if t == "latex" else ExprExtractionConfig()
              for t in match_types]
    return bool(verify(parse(gold, config), parse(pred, config), float_rounding=precision, strict=True,
                       allow_set_relation_comp=set_relation))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--math-verify-repo", required=True,
                        help="a checkout (or bare mirror) of huggingface/Math-Verify")
    parser.add_argument("--json", default=None, help="also write every row here")
    parser.add_argument("--show", type=int, default=40, help="print at most this many worse rows per mode")
    args = parser.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from rlhf_ext.rewards.extraction import prepare_gold
    from rlhf_ext.rewards.math_verify_recipe import grade_response

    rows = suite_rows(args.math_verify_repo)
    report = {"rows": len(rows), "modes": {}}
    records = []
    for test, gold, pred, expected, match_types, precision, set_relation in rows:
        mv = math_verify_verdict(gold, pred, match_types, precision, set_relation)
        record = {"test": test, "gold": gold, "pred": pred, "expected": expected, "math_verify": mv}
        for mode, anchor in (("reward", True), ("evaluation", False)):
            record[mode] = bool(grade_response(pred, prepare_gold(gold), {}, require_anchor=anchor)["correct"])
        records.append(record)
    print(f"{len(rows)} rows from {', '.join(SUITE_FILES)}; math-verify matches the expectation on "
          f"{sum(r['math_verify'] == r['expected'] for r in records)}")
    for mode in ("evaluation", "reward"):
        worse = [r for r in records if r["math_verify"] == r["expected"] != r[mode]]
        better = [r for r in records if r[mode] == r["expected"] != r["math_verify"]]
        ok = sum(r[mode] == r["expected"] for r in records)
        no_anchor = [r for r in worse if mode == "reward" and r["evaluation"] == r["expected"]]
        worse = [r for r in worse if r not in no_anchor]
        report["modes"][mode] = {"matches_expected": ok, "worse": len(worse), "better": len(better),
                                 "worse_only_for_want_of_an_anchor": len(no_anchor)}
        print(f"{mode} mode: matches the expectation on {ok}; worse than math-verify {len(worse)}"
              + (f" (and {len(no_anchor)} more that state no anchor, right in evaluation mode)" if no_anchor else "")
              + f", better {len(better)}")
        for r in worse[: args.show]:
            print(f"   worse  {r['test']}: gold {r['gold']!r} pred {r['pred'][-90:]!r} expected {r['expected']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": report, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``data clean``: rule filters over a JSONL of problems, each drop counted by its rule.

Rules, applied in this order (a row is counted under the first rule that drops it):

1. ``missing`` -- no problem text or no answer;
2. ``ungradable`` -- the gold answer does not grade as equal to itself with rlhf_ext's
   ``MathGrader`` (math-verify cannot parse it, or parsing times out);
3. ``web`` -- a URL or web boilerplate ("click here", "all rights reserved", ...);
4. ``language`` -- more than ``--max-cjk`` of the letters are CJK (for English training sets);
5. ``contaminated`` -- shares a word n-gram with a benchmark problem (:mod:`.decontaminate`), each
   hit listed with the benchmark item it matched;
6. ``duplicate`` -- same normalised text as an earlier row;
7. ``near_duplicate`` -- MinHash-estimated Jaccard similarity of character 5-gram shingles
   >= ``--near-dup-threshold`` with an earlier row (``datasketch``'s MinHash LSH; Broder 1997).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ..ground.subcommands import set_subcommand_handler
from .decontaminate import NgramIndex, load_benchmarks
from .io import DataToolError, read_jsonl
from .rules import char_shingles, cjk_fraction, normalize, web_junk

RULES = ("missing", "ungradable", "web", "language", "contaminated", "duplicate", "near_duplicate")
NUM_PERM = 128


def _field(row: dict, key: Optional[str], defaults: Sequence[str]):
    keys = (key,) if key else defaults
    return next((row[k] for k in keys if row.get(k) not in (None, "")), None)


def clean_rows(rows: List[dict], *, problem_key: Optional[str] = None, answer_key: Optional[str] = None,
               check_gradable: bool = True, max_cjk: float = 0.5, benchmark_dirs: Sequence[Path] = (),
               against: Sequence[Path] = (), ngram: int = 8, near_dup_threshold: Optional[float] = 0.8,
               grader_timeout: float = 5.0) -> Tuple[List[dict], List[dict], List[dict], Counter]:
    """``(kept rows, dropped rows with "drop_rule"/"drop_detail", contamination hits, counts per rule)``."""
    if near_dup_threshold is not None and not 0.0 < near_dup_threshold <= 1.0:
        raise DataToolError(f"--near-dup-threshold must be in (0, 1], got {near_dup_threshold}")
    if not 0.0 <= max_cjk <= 1.0:
        raise DataToolError(f"--max-cjk must be in [0, 1], got {max_cjk}")
    text_keys = ("problem", "question", "prompt", "Problem")
    answer_keys = ("answer", "label", "Answer", "solution")
    texts = [_field(r, problem_key, text_keys) for r in rows]
    golds = [_field(r, answer_key, answer_keys) for r in rows]
    verdict: List[Optional[Tuple[str, str]]] = [None] * len(rows)

    for i, (t, g) in enumerate(zip(texts, golds)):
        if t is None or g is None:
            verdict[i] = ("missing", "no problem text" if t is None else "no answer")

    if check_gradable:
        from rlhf_ext.rewards import MathGrader

        todo = [i for i in range(len(rows)) if verdict[i] is None]
        with MathGrader(timeout=grader_timeout) as grader:
            futures = [(i, grader.submit(f"\\boxed{{{golds[i]}}}", str(golds[i]))) for i in todo]
            for i, fut in futures:
                res = fut.result()
                if not res.correct:
                    detail = "grading timed out" if res.timeout else f"answer {str(golds[i])[:60]!r}"
                    verdict[i] = ("ungradable", detail)

    for i, t in enumerate(texts):
        if verdict[i] is None:
            junk = web_junk(str(t))
            if junk:
                verdict[i] = ("web", junk[:80])
            elif cjk_fraction(str(t)) > max_cjk:
                verdict[i] = ("language", f"CJK share {cjk_fraction(str(t)):.2f} > {max_cjk}")

    hits: List[dict] = []
    items = load_benchmarks(benchmark_dirs, against)
    if items:
        index = NgramIndex(items, ngram)
        for i, t in enumerate(texts):
            if verdict[i] is None:
                m = index.match(str(t))
                if m:
                    item, gram = m
                    verdict[i] = ("contaminated", f"{item.benchmark}/{item.id}")
                    hits.append({"line": i + 1, "text": str(t), "benchmark": item.benchmark,
                                 "benchmark_id": item.id, "benchmark_text": item.text, "ngram": gram})

    seen = {}
    for i, t in enumerate(texts):
        if verdict[i] is None:
            key = normalize(str(t))
            if key in seen:
                verdict[i] = ("duplicate", f"line {seen[key] + 1}")
            else:
                seen[key] = i

    if near_dup_threshold is not None:
        from datasketch import MinHash, MinHashLSH

        lsh = MinHashLSH(threshold=near_dup_threshold, num_perm=NUM_PERM)
        for i, t in enumerate(texts):
            if verdict[i] is not None:
                continue
            mh = MinHash(num_perm=NUM_PERM, seed=1)
            for sh in char_shingles(str(t)):
                mh.update(sh.encode("utf-8"))
            similar = lsh.query(mh)
            if similar:
                verdict[i] = ("near_duplicate", f"line {min(similar) + 1}")
            else:
                lsh.insert(i, mh)

    kept, dropped, counts = [], [], Counter()
    for row, v in zip(rows, verdict):
        if v is None:
            kept.append(row)
        else:
            counts[v[0]] += 1
            dropped.append({**row, "drop_rule": v[0], "drop_detail": v[1]})
    return kept, dropped, hits, counts


def add_clean_command(subparsers, make_parser, output_args) -> None:
    p = make_parser(subparsers, "clean", "rule filters, dedup and benchmark decontamination with per-rule counts",
                    __doc__.split("\n\n", 1)[1].replace("``", "'"),
                    "rlhf-ext data clean train.jsonl --benchmarks ../shared/data --against my_eval.jsonl "
                    "--output train.clean.jsonl --dropped train.dropped.jsonl")
    p.add_argument("file", type=Path, help="JSONL of problems with answers")
    p.add_argument("--problem-key", help="field with the problem (default: problem, question, prompt, Problem)")
    p.add_argument("--answer-key", help="field with the answer (default: answer, label, Answer, solution)")
    p.add_argument("--benchmarks", type=Path, action="append", default=[], metavar="DIR",
                   help="directory with evalkit's benchmark files (aime24.jsonl, math500.jsonl, gsm8k_test.jsonl, "
                        "...) to decontaminate against; repeatable")
    p.add_argument("--against", type=Path, action="append", default=[], metavar="FILE",
                   help="any JSONL of problems to decontaminate against; repeatable")
    p.add_argument("--ngram", type=int, default=8, help="word n-gram length of the overlap test (default 8)")
    p.add_argument("--near-dup-threshold", type=float, default=0.8,
                   help="MinHash Jaccard threshold for near duplicates (default 0.8)")
    p.add_argument("--no-near-dup", action="store_true", help="skip near-duplicate detection")
    p.add_argument("--max-cjk", type=float, default=0.5, help="drop texts whose letters are more than this "
                                                              "fraction CJK (default 0.5; 1 disables)")
    p.add_argument("--no-grade-check", action="store_true", help="skip the gradable-answer check")
    p.add_argument("--dropped", type=Path, help="also write the dropped rows, with drop_rule/drop_detail")
    p.add_argument("--hits", type=Path, help="write every contamination hit (default: OUTPUT with "
                                             ".contamination.jsonl)")
    output_args(p, "cleaned file")
    set_subcommand_handler(p, run_clean)


def run_clean(args: argparse.Namespace) -> int:
    from .io import check_output, write_jsonl

    hits_path = args.hits or args.output.with_name(args.output.stem + ".contamination.jsonl")
    for path in [args.output, hits_path] + ([args.dropped] if args.dropped else []):
        check_output(path, args.force)
    rows = read_jsonl(args.file)
    if not rows:
        raise DataToolError(f"{args.file}: no rows")
    kept, dropped, hits, counts = clean_rows(
        rows, problem_key=args.problem_key, answer_key=args.answer_key, check_gradable=not args.no_grade_check,
        max_cjk=args.max_cjk, benchmark_dirs=args.benchmarks, against=args.against, ngram=args.ngram,
        near_dup_threshold=None if args.no_near_dup else args.near_dup_threshold)
    write_jsonl(args.output, kept, force=True)
    if args.dropped:
        write_jsonl(args.dropped, dropped, force=True)
    decontaminated = bool(args.benchmarks or args.against)
    if decontaminated:
        write_jsonl(hits_path, hits, force=True)
    print(f"data clean: {len(rows)} rows -> kept {len(kept)}, dropped {len(dropped)} ({args.output})")
    for rule in RULES:
        skipped = ((rule == "contaminated" and not decontaminated) or (rule == "near_duplicate" and args.no_near_dup)
                   or (rule == "ungradable" and args.no_grade_check))
        print(f"  {rule:<15} {'skipped' if skipped else counts.get(rule, 0):>7}")
    if decontaminated:
        for h in hits[:20]:
            print(f"  hit: line {h['line']} ~ {h['benchmark']}/{h['benchmark_id']}: {h['ngram']!r}")
        if len(hits) > 20:
            print(f"  ... {len(hits) - 20} more")
        print(f"  contamination hits: {hits_path}")
    else:
        print("  (no --benchmarks DIR / --against FILE: decontamination skipped)")
    return 0

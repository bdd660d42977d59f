"""``evalkit audit RUN_DIR --n 50``: how often does the grader grade wrongly? A person checks a sample.

1. **Draw** (once per run directory; kept in ``RUN_DIR/audit/sample.jsonl``): ``n`` graded
   samples, stratified by task and by the grader's verdict (correct / wrong), proportionally to
   each stratum's size (largest remainders; every non-empty stratum gets at least one when ``n``
   allows), with a seeded generator, so the rare stratum (e.g. the few correct answers of a weak
   model) is not missed.
2. **Judge**: the person reads each answer beside the gold answer and types ``y`` (the answer is
   correct), ``n`` (it is not), ``s`` (skip) or ``q`` (stop; judged items are kept and the next
   call continues); or ``--verdicts FILE`` gives them as JSONL lines ``{"id": "...", "correct":
   true|false}``. Verdicts go to ``RUN_DIR/audit/verdicts.jsonl``.
3. **Report** (``RUN_DIR/audit.json``, read by ``evalkit compare`` and ``rlhf-ext report`` for the
   minimum effect, :mod:`rlhf_ext.evalkit.resolution`): the grader's error rate, the share of
   answers whose grade differs from the person's, estimated over the strata,
   ``sum_h W_h e_h`` (``W_h`` = the stratum's share of all graded samples, ``e_h`` its judged
   error share), with a 95% interval; and per grader verdict the error share (false positives
   among answers graded correct, false negatives among those graded wrong) with Wilson intervals.

The interval of the overall rate is Wilson's score interval (Wilson 1927) at the stratified
estimate with the number of judged items; with proportional allocation the weights are close to
the sampling fractions, so this is the usual binomial interval of a proportion. Nothing the model
wrote is executed: the person reads it.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..ground.jsonfiles import iter_jsonl
from .records import CONFIG_FILE, SAMPLES_FILE, RunDirError, SampleLog, write_json_atomic
from .resolution import AUDIT_FILE

AUDIT_DIR = "audit"
# ``--disagreements``: the samples the verifier cascade judged otherwise than the rules (.verifier)
DISAGREEMENTS_DIR = "audit_disagreements"
DISAGREEMENTS_FILE = "audit_disagreements.json"
SAMPLE_FILE = "sample.jsonl"
VERDICTS_FILE = "verdicts.jsonl"
Z95 = 1.959963984540054


def item_id(rec: dict) -> str:
    return f"{rec['task']}/{rec['problem_id']}/{rec['sample_index']}"


def _stratum(rec: dict) -> Tuple[str, bool]:
    return str(rec["task"]), bool(rec.get("correct"))


def allocate(sizes: Dict[Tuple[str, bool], int], n: int) -> Dict[Tuple[str, bool], int]:
    """Proportional allocation of ``n`` draws over strata of ``sizes`` (largest remainders), at least
    one per non-empty stratum when ``n`` is at least the number of such strata, never more than a
    stratum holds."""
    total = sum(sizes.values())
    if n >= total:
        return dict(sizes)
    keys = sorted(k for k, v in sizes.items() if v > 0)
    quota = {k: n * sizes[k] / total for k in keys}
    take = {k: int(math.floor(quota[k])) for k in keys}
    if n >= len(keys):
        for k in keys:
            take[k] = max(1, take[k])
    left = n - sum(take.values())
    for k in sorted(keys, key=lambda k: (-(quota[k] - math.floor(quota[k])), k)):
        if left <= 0:
            break
        if take[k] < sizes[k]:
            take[k] += 1
            left -= 1
    while left < 0:  # the minimum of one overshot n: take back from the largest allocations
        k = max(keys, key=lambda k: (take[k] - quota[k], k))
        take[k] -= 1
        left += 1
    return take


def draw(records: Sequence[dict], n: int, seed: int = 0) -> List[dict]:
    """The stratified sample (see the module doc), in a shuffled order so the strata are mixed."""
    if n < 1:
        raise ValueError(f"--n must be >= 1, got {n}")
    graded = [r for r in records if "correct" in r]
    if not graded:
        raise RunDirError("no graded sample to audit")
    strata: Dict[Tuple[str, bool], List[dict]] = {}
    for rec in graded:
        strata.setdefault(_stratum(rec), []).append(rec)
    take = allocate({k: len(v) for k, v in strata.items()}, n)
    rng = random.Random(seed)
    out = []
    for key in sorted(take):
        pool = sorted(strata[key], key=item_id)
        for rec in rng.sample(pool, take[key]):
            out.append({"id": item_id(rec), "task": rec["task"], "stratum": {"task": key[0], "graded_correct": key[1]},
                        "weight": len(strata[key]) / len(graded) / take[key],
                        "prompt": rec.get("prompt"), "response": rec.get("response"),
                        "extracted": rec.get("extracted"), "gold": rec.get("gold"),
                        "graded_correct": bool(rec.get("correct")),
                        **({"verifier": rec["verifier"]} if rec.get("verifier") else {})})
    rng.shuffle(out)
    return out


def _read_jsonl(path: Path) -> List[dict]:
    if not path.exists():
        return []
    return [obj for _, obj in iter_jsonl(path, RunDirError)]


def _append(path: Path, obj: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")


def load_or_draw(run_dir: Path, n: int, seed: int, disagreements: bool = False) -> List[dict]:
    """The run's audit sample: the stored one (its size and seed must match), else a new draw
    (``disagreements``: only of the samples where the verifier and the rules disagree)."""
    audit_dir = run_dir / (DISAGREEMENTS_DIR if disagreements else AUDIT_DIR)
    sample_path = audit_dir / SAMPLE_FILE
    meta_path = audit_dir / "draw.json"
    if sample_path.exists():
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if meta.get("n") != n or meta.get("seed") != seed:
            raise RunDirError(f"{sample_path} was drawn with --n {meta.get('n')} --seed {meta.get('seed')}; "
                              f"rerun with those, or remove {audit_dir} to draw anew")
        return _read_jsonl(sample_path)
    if not (run_dir / CONFIG_FILE).exists():
        raise RunDirError(f"{run_dir} is not an evalkit run directory (no {CONFIG_FILE})")
    records = SampleLog(run_dir / SAMPLES_FILE).read()
    if disagreements:
        from .verifier import disagreements as disagreeing

        records = disagreeing(records)
        if not records:
            raise RunDirError(f"{run_dir}: no sample where the verifier and the rules disagree (run evalkit with "
                              "--verifier-url and --verifier-model first)")
    sample = draw(records, n, seed)
    audit_dir.mkdir(exist_ok=True)
    sample_path.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in sample), encoding="utf-8")
    write_json_atomic(meta_path, {"n": n, "seed": seed, "graded_samples": len([r for r in records if "correct" in r])})
    return sample


def read_verdicts_file(path: Path, ids: Sequence[str]) -> Dict[str, bool]:
    """``{"id": ..., "correct": bool}`` lines; an id not in the sample or a non-boolean verdict is an error."""
    known = set(ids)
    out = {}
    for i, obj in enumerate(_read_jsonl(Path(path)), 1):
        if obj.get("id") not in known:
            raise RunDirError(f"{path}:{i}: id {obj.get('id')!r} is not in the audit sample")
        if not isinstance(obj.get("correct"), bool):
            raise RunDirError(f"{path}:{i}: 'correct' must be true or false, got {obj.get('correct')!r}")
        out[obj["id"]] = obj["correct"]
    return out


def ask(sample: Sequence[dict], done: Dict[str, bool], record: Callable[[str, bool], None],
        read: Callable[[str], str] = input, write: Callable[[str], None] = print) -> int:
    """Show each unjudged item and read the person's verdict; returns how many were judged now."""
    todo = [s for s in sample if s["id"] not in done]
    judged = 0
    for i, item in enumerate(todo, 1):
        write(f"\n--- {i}/{len(todo)}  {item['id']}  (grader: {'correct' if item['graded_correct'] else 'wrong'})")
        write(f"PROMPT:\n{item.get('prompt')}\nRESPONSE:\n{item.get('response')}")
        write(f"extracted answer: {item.get('extracted')!r}    gold: {item.get('gold')!r}")
        if item.get("verifier"):
            write(f"verifier {item['verifier'].get('model')}: {item['verifier'].get('status')} "
                  f"(reply {item['verifier'].get('reply')!r})")
        while True:
            try:
                answer = read("Is the response's answer correct? [y]es / [n]o / [s]kip / [q]uit: ").strip().lower()
            except EOFError:
                return judged
            if answer in ("y", "yes", "n", "no"):
                record(item["id"], answer.startswith("y"))
                judged += 1
                break
            if answer in ("s", "skip"):
                break
            if answer in ("q", "quit"):
                return judged
            write("please type y, n, s or q")
    return judged


def wilson(errors: float, n: int, z: float = Z95) -> Tuple[float, float]:
    """Wilson score interval of a proportion ``errors / n`` (``errors`` may be a weighted estimate x n)."""
    if n == 0:
        return 0.0, 1.0
    p = errors / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(sample: Sequence[dict], verdicts: Dict[str, bool]) -> dict:
    """The error-rate report of the judged items (see the module doc)."""
    judged = [s for s in sample if s["id"] in verdicts]
    out: dict = {"sampled": len(sample), "judged": len(judged)}
    if not judged:
        return out
    strata: Dict[Tuple[str, bool], List[dict]] = {}
    for s in judged:
        strata.setdefault((s["stratum"]["task"], s["stratum"]["graded_correct"]), []).append(s)
    # stratum weights W_h: the stratum's share of all graded samples (from the draw's weights)
    shares = {}
    for s in sample:
        key = (s["stratum"]["task"], s["stratum"]["graded_correct"])
        shares[key] = shares.get(key, 0.0) + s["weight"]
    judged_share = sum(shares[k] for k in strata)
    estimate = sum(shares[k] / judged_share * _errors(v, verdicts) / len(v) for k, v in strata.items())
    low, high = wilson(estimate * len(judged), len(judged))
    out["error_rate"] = {"value": estimate, "ci95": [low, high], "errors": sum(_errors(v, verdicts)
                                                                           for v in strata.values())}
    for graded, name in ((True, "graded_correct"), (False, "graded_wrong")):
        items = [s for s in judged if s["graded_correct"] is graded]
        if items:
            e = _errors(items, verdicts)
            lo, hi = wilson(e, len(items))
            out[name] = {"judged": len(items), "errors": e, "error_rate": e / len(items), "ci95": [lo, hi]}
    out["disagreements"] = [s["id"] for s in judged if verdicts[s["id"]] != s["graded_correct"]]
    return out


def _errors(items: Sequence[dict], verdicts: Dict[str, bool]) -> int:
    return sum(1 for s in items if verdicts[s["id"]] != s["graded_correct"])


def render(report: dict) -> str:
    if not report.get("judged"):
        return f"audit: {report['sampled']} sampled, none judged yet"
    if report.get("population") == "verifier_disagreements":
        e = report["verifier_right"]
        return (f"verifier right on {e['errors']} of {report['judged']} judged disagreements "
                f"({report['sampled']} sampled): {100 * e['value']:.1f}% [{100 * e['ci95'][0]:.1f}, "
                f"{100 * e['ci95'][1]:.1f}] (95% Wilson interval); the rest are the verifier's false positives")
    e = report["error_rate"]
    lines = [f"grader error rate: {100 * e['value']:.1f}% [{100 * e['ci95'][0]:.1f}, {100 * e['ci95'][1]:.1f}] "
             f"(95% Wilson interval; {e['errors']} disagreement(s) in {report['judged']} judged of "
             f"{report['sampled']} sampled, stratified by task and grade)"]
    for name, what in (("graded_correct", "graded correct, person says wrong (false positives)"),
                       ("graded_wrong", "graded wrong, person says correct (false negatives)")):
        part = report.get(name)
        if part:
            lines.append(f"  {what}: {part['errors']} of {part['judged']} = {100 * part['error_rate']:.1f}% "
                         f"[{100 * part['ci95'][0]:.1f}, {100 * part['ci95'][1]:.1f}]")
    if report.get("disagreements"):
        lines.append("  disagreements: " + ", ".join(report["disagreements"]))
    return "\n".join(lines)


def run_audit(run_dir, n: int = 50, seed: int = 0, verdicts_file: Optional[Path] = None,
              read: Callable[[str], str] = input, write: Callable[[str], None] = print,
              disagreements: bool = False) -> dict:
    """Draw (or reload) the sample, collect verdicts (file or prompt), write ``audit.json``; returns it.

    ``disagreements``: audit the samples the verifier cascade overturned instead (``audit/`` and
    ``audit.json`` become ``audit_disagreements/`` and ``audit_disagreements.json``): there the
    grader's "error rate" is the share the verifier got right."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a directory")
    sample = load_or_draw(run_dir, n, seed, disagreements)
    verdict_path = run_dir / (DISAGREEMENTS_DIR if disagreements else AUDIT_DIR) / VERDICTS_FILE
    done = {v["id"]: v["correct"] for v in _read_jsonl(verdict_path)}

    def record(item: str, correct: bool) -> None:
        _append(verdict_path, {"id": item, "correct": correct})
        done[item] = correct

    if verdicts_file is not None:
        for item, correct in read_verdicts_file(verdicts_file, [s["id"] for s in sample]).items():
            record(item, correct)
    else:
        ask(sample, done, record, read=read, write=write)
    report = {"run_dir": str(run_dir), "n": n, "seed": seed, **summarize(sample, done)}
    if disagreements:
        report["population"] = "verifier_disagreements"
        if "error_rate" in report:  # every item was graded wrong by the rules and right by the verifier
            report["verifier_right"] = report["error_rate"]
    write_json_atomic(run_dir / (DISAGREEMENTS_FILE if disagreements else AUDIT_FILE), report)
    return report


def add_arguments(p) -> None:
    """``evalkit audit``'s flags (its row in ``rlhf_ext.evalkit.cli.SUBCOMMANDS`` holds its description)."""
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="an evalkit output directory")
    p.add_argument("--n", type=int, default=50, help="answers to sample (default 50)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--verdicts", type=Path, default=None, metavar="FILE",
                   help='JSONL of {"id": "task/problem/sample", "correct": true|false}: the person\'s verdicts')
    p.add_argument("--json", action="store_true", help="print audit.json instead of the summary")
    p.add_argument("--disagreements", action="store_true",
                   help="sample only the answers the verifier cascade judged otherwise than the rules (evalkit "
                        "--verifier-url): the report is how often the verifier was right (audit_disagreements.json)")


def run(args) -> int:
    from ..ground.subcommands import usage_error

    if args.n < 1:
        usage_error(args, f"--n must be >= 1, got {args.n}")
    report = run_audit(args.run_dir, args.n, args.seed, args.verdicts, disagreements=args.disagreements)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0

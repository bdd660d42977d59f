"""evalkit's verifier cascade (``--verifier-url URL --verifier-model NAME``): after the rule grader, an
LLM verifier judges the samples the rules scored wrong (:mod:`rlhf_ext.rewards.verifier_cascade`).

Each such sample's record gets, beside the rule verdict ``correct``, a ``verifier`` entry (model,
status ``correct``/``wrong``/``failed``/``skipped``, error, reply, seconds, tokens) and
``correct_cascade`` (right by the rules or by the verifier). The verifier runs on a finished run
directory, so it can be added to an old run; a rerun asks again only the samples with no verdict of
this verifier model (a failure is asked again). ``samples.jsonl`` is rewritten atomically once, at
the end of the pass. The summary gets a ``cascade`` section: the rule-only and cascade numbers side
by side, and the verifier's counts; ``evalkit audit --disagreements`` draws the samples where the
two differ for a person to check.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from rlhf_ext.rewards.verifier_cascade import (Candidate, CascadeStats, VerifierCascade, VerifierSettings,
                                               VerifierVerdict, cascade_correct)

from . import records
from .records import SampleLog

CASCADE_METRICS = ("avg@n", "maj@n", "pass@k")


def needs_verdict(rec: dict, model: str) -> bool:
    """A math sample the rules scored wrong without a verdict of ``model`` (a failed ask counts as none)."""
    if rec.get("correct") or rec.get("answer_type", "math") != "math":
        return False
    v = rec.get("verifier")
    return not v or v.get("model") != model or v.get("status") == "failed"


def verify_run_dir(run_dir, problems: Dict[Tuple[str, str], str], settings: VerifierSettings,
                   log: Callable[[str], None] = print) -> CascadeStats:
    """Ask the verifier about the rule-wrong samples of ``run_dir`` still without its verdict and record
    the verdicts; ``problems``: (task, problem id) -> problem text. Returns the pass's counts."""
    path = Path(run_dir) / records.SAMPLES_FILE
    recs = SampleLog(path).read()
    todo = [i for i, r in enumerate(recs) if needs_verdict(r, settings.model)]
    if not todo:
        return CascadeStats()
    log(f"evalkit: asking the verifier {settings.model} at {settings.url} about {len(todo)} rule-wrong samples")
    candidates = [Candidate(problem=problems.get((recs[i]["task"], str(recs[i]["problem_id"]))),
                            gold=str(recs[i].get("gold")), answer=recs[i].get("extracted")) for i in todo]
    with VerifierCascade(settings) as cascade:
        verdicts, stats = cascade.verify(candidates)
    for i, verdict in zip(todo, verdicts):
        recs[i]["verifier"] = verdict.record(settings.model)
        recs[i]["correct_cascade"] = cascade_correct(recs[i]["correct"], recs[i]["verifier"])
    records.write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                                            for r in recs))
    return stats


def has_verdicts(recs: Sequence[dict]) -> bool:
    return any("verifier" in r for r in recs)


def recorded_counts(recs: Sequence[dict]) -> dict:
    """The verifier's counts over a run's records (what the summary shows)."""
    stats = CascadeStats()
    models = set()
    for r in recs:
        v = r.get("verifier")
        if not v:
            continue
        models.add(v.get("model"))
        stats.add(VerifierVerdict(v.get("status") or "failed", error=v.get("error"),
                                  prompt_tokens=int(v.get("prompt_tokens") or 0),
                                  completion_tokens=int(v.get("completion_tokens") or 0)))
        stats.seconds += float(v.get("seconds") or 0.0)
    out = stats.as_dict()
    out["request_seconds"] = out.pop("seconds")  # summed per request: not the wall time of a pass
    out["models"] = sorted(m for m in models if m)
    return out


def cascaded(recs: Sequence[dict]) -> List[dict]:
    """The records with the cascade's verdict as ``correct`` (and no verifier entry)."""
    out = []
    for r in recs:
        c = {k: v for k, v in r.items() if k not in ("verifier", "correct_cascade")}
        c["correct"] = cascade_correct(r.get("correct"), r.get("verifier"))
        out.append(c)
    return out


def cascade_section(recs: Sequence[dict], task_summaries: Callable[[List[dict]], dict]) -> dict:
    """``summary["cascade"]``: the verifier's counts and, per task, the cascade's avg@n, maj@n and pass@k
    (``task_summaries``: records -> the summary's ``tasks``, computed as for the rule verdicts)."""
    tasks = task_summaries(cascaded(recs))
    return {"verifier": recorded_counts(recs),
            "tasks": {t: {m: s[m] for m in CASCADE_METRICS if m in s} for t, s in tasks.items()}}


def _pct(m: Optional[dict]) -> str:
    if not m:
        return "-"
    lo, hi = m["ci95"]
    return f"{100 * m['value']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def cascade_markdown(summary: dict) -> List[str]:
    """The summary's side-by-side table of rule-only and cascade numbers (empty without a verifier)."""
    cascade = summary.get("cascade")
    if not cascade:
        return []
    n = summary["n_samples"]
    c = cascade["verifier"]
    fails = ", ".join(f"{k} {v}" for k, v in sorted(c["failures"].items()))
    lines = [f"Verifier cascade ({', '.join(c['models'])}): the rules first, the verifier on the {c['rule_wrong']} "
             f"rule-wrong samples: asked {c['asked']} ({c['skipped']} had no final answer), judged correct "
             f"{c['overturned']}, wrong {c['upheld']}, failed {c['failed']}"
             + (f" ({fails}; the rule verdict stands)" if fails else "") + ".", ""]
    header = ["task", f"avg@{n} rules", f"avg@{n} cascade", f"maj@{n} rules", f"maj@{n} cascade",
              f"pass@{n} rules", f"pass@{n} cascade"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for task, rule in summary["tasks"].items():
        cas = cascade["tasks"].get(task, {})
        row = [task]
        for m in ("avg@n", "maj@n"):
            row += [_pct(rule.get(m)), _pct(cas.get(m))]
        row += [_pct(rule.get("pass@k", {}).get(str(n))), _pct(cas.get("pass@k", {}).get(str(n)))]
        lines.append("| " + " | ".join(row) + " |")
    return lines + [""]


def disagreements(recs: Sequence[dict]) -> List[dict]:
    """The samples whose cascade verdict differs from the rule verdict (the verifier overturned them)."""
    return [r for r in recs if cascade_correct(r.get("correct"), r.get("verifier")) != bool(r.get("correct"))]

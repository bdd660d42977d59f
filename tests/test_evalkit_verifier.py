"""The verifier cascade (issue 41, item 5): rules first, an LLM verifier on what they score wrong.

Fast tests drive the real HTTP client against small local servers of this module (a verifier that
says CORRECT / INCORRECT, one that answers garbage, one that never answers in time, one that fails
with HTTP 500, a closed port) and evalkit's real run directory, summary and audit. The last test
starts one real vLLM OpenAI-compatible server on the tiny model (run it under the machine's lock:
``flock /tmp/e2e.lock``): the mechanics against the real protocol, not the judge's quality.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlhf_ext.evalkit.audit import run_audit
from rlhf_ext.evalkit.prepare import prepare
from rlhf_ext.evalkit.prompts import render_prompts
from rlhf_ext.evalkit.runner import RunOptions, run_config
from rlhf_ext.evalkit.tiny_model import build_tiny_model
from rlhf_ext.rewards.verifier_cascade import (Candidate, VerifierCascade, VerifierSettings, cascade_correct,
                                               parse_verdict, verifier_messages)

DATA = Path("../shared/data/math500.jsonl").resolve()
SECRET_TAIL = "SECRET-REASONING-TAIL"  # in responses, never in a verifier prompt


class Judge(BaseHTTPRequestHandler):
    """A scripted OpenAI-compatible verifier: the student's final answer picks the behaviour."""

    requests = []
    inflight = 0
    max_inflight = 0
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.requests.append(body)
            cls.inflight += 1
            cls.max_inflight = max(cls.max_inflight, cls.inflight)
        try:
            user = body["messages"][-1]["content"]
            answer = user.split("Student's final answer: ", 1)[1].split("\n", 1)[0]
            if "999" in answer:  # never in time
                time.sleep(3)
                return self._send(200, {"choices": [{"message": {"content": "CORRECT"}}]})
            if "500" in answer:
                return self._send(500, {"error": "boom"})
            if "888" in answer:  # a 200 with a reply that is no verdict
                return self._send(200, {"choices": [{"message": {"content": "lorem ipsum CORRECT-ish"}}],
                                        "usage": {"prompt_tokens": 50, "completion_tokens": 4}})
            if "444" in answer:  # not the API's JSON at all
                return self._send(200, "<html>proxy error</html>")
            if "slow" in answer:
                time.sleep(0.3)
            verdict = "CORRECT" if ("12345" in answer or "slow" in answer) else "INCORRECT"
            self._send(200, {"choices": [{"message": {"content": f"Verdict: **{verdict}**"}}],
                             "usage": {"prompt_tokens": 100, "completion_tokens": 3}})
        finally:
            with cls.lock:
                cls.inflight -= 1

    def _send(self, code, payload):
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        try:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout)


@pytest.fixture()
def judge():
    Judge.requests, Judge.inflight, Judge.max_inflight = [], 0, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_parse_verdict_reads_only_a_last_line_verdict():
    yes = ["CORRECT", "correct.", "**Verdict: CORRECT**", "<think>maybe INCORRECT</think>\nCORRECT",
           "The answers match.\n\\boxed{CORRECT}", "Final answer: correct"]
    no = ["INCORRECT", "incorrect!", "Verdict: INCORRECT", "`INCORRECT`"]
    for reply in yes:
        assert parse_verdict(reply) is True, reply
    for reply in no:
        assert parse_verdict(reply) is False, reply
    for reply in ["", "   ", "This is not CORRECT", "CORRECT or INCORRECT", "yes", "CORRECTINCORRECT", None, 7,
                  "CORRECT\nbut wait, no"]:
        assert parse_verdict(reply) is None, reply


def test_prompt_holds_problem_gold_and_final_answer_only():
    msgs = verifier_messages("What is 1/2 + 1/2?", "1", "\\frac{2}{2}")
    user = msgs[-1]["content"]
    assert "Problem:\nWhat is 1/2 + 1/2?" in user and "Reference answer: 1" in user
    assert "Student's final answer: \\frac{2}{2}" in user and "CORRECT or INCORRECT" in msgs[0]["content"]
    long = verifier_messages("p", "1", "x" * 100_000)[-1]["content"]
    assert len(long) < 5000 and long.count("x") == 4000  # a runaway answer is clipped


def test_settings_are_checked():
    assert VerifierSettings("http://h:8000", "m").endpoint == "http://h:8000/v1/chat/completions"
    assert VerifierSettings("http://h:8000/v1/", "m").endpoint == "http://h:8000/v1/chat/completions"
    for bad, match in [(dict(url="h:8000", model="m"), "http"), (dict(url="http://h", model=" "), "model name"),
                       (dict(url="http://h", model="m", timeout=0), "timeout"),
                       (dict(url="http://h", model="m", concurrency=0), "concurrency")]:
        with pytest.raises(ValueError, match=match):
            VerifierSettings(**bad).validate()
    with pytest.raises(ValueError, match="unknown verifier setting"):
        VerifierSettings.from_mapping({"url": "http://h", "model": "m", "temperature": 1})


def test_every_failure_leaves_the_rule_verdict_and_is_counted(judge):
    cands = [Candidate("p", "15", "12345"), Candidate("p", "15", "777"), Candidate("p", "15", "999"),
             Candidate("p", "15", "888"), Candidate("p", "15", "500"), Candidate("p", "15", "444"),
             Candidate("p", "15", None)]
    settings = VerifierSettings(judge, "judge", timeout=0.5, concurrency=4)
    with VerifierCascade(settings) as cascade:
        verdicts, stats = cascade.verify(cands)
    assert [v.status for v in verdicts] == ["correct", "wrong", "failed", "failed", "failed", "failed", "skipped"]
    assert [v.failure_kind for v in verdicts[2:6]] == ["timeout", "unreadable", "http", "malformed"]
    assert (stats.rule_wrong, stats.asked, stats.overturned, stats.upheld, stats.failed, stats.skipped) == \
        (7, 6, 1, 1, 4, 1)
    assert stats.failures == {"timeout": 1, "unreadable": 1, "http": 1, "malformed": 1}
    assert stats.prompt_tokens == 250 and stats.completion_tokens == 10  # two verdicts + the garbage reply
    assert [cascade_correct(False, v.record("judge")) for v in verdicts] == [True] + [False] * 6
    assert verdicts[2].seconds < 2.5  # the timeout, not the server's 3 s
    # a verifier that is not there at all
    with VerifierCascade(VerifierSettings(f"http://127.0.0.1:{_closed_port()}", "judge", timeout=2)) as cascade:
        verdicts, stats = cascade.verify([Candidate("p", "1", "2")])
    assert verdicts[0].failure_kind == "connection" and stats.failures == {"connection": 1}


def test_concurrency_is_bounded(judge):
    with VerifierCascade(VerifierSettings(judge, "judge", timeout=5, concurrency=3)) as cascade:
        verdicts, _ = cascade.verify([Candidate("p", "1", f"slow {i}") for i in range(9)])
    assert all(v.status == "correct" for v in verdicts)
    assert Judge.max_inflight == 3


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("verifier") / "tiny", seed=0, max_position_embeddings=2048)


# sample index -> response; the rules score these (\boxed{gold} right, the rest wrong)
def _responses(gold):
    return [f"So the answer is \\boxed{{{gold}}}.", "... \\boxed{12345}. " + SECRET_TAIL,
            "... \\boxed{777}", "... \\boxed{888}", "I could not solve it."]


def _finished_run(model, out, limit=2):
    """A finished evalkit run directory, as the runner writes it, without generating."""
    options = RunOptions(suite="math500", model=str(model), data=[str(DATA)], limit=limit, n_samples=5,
                         max_tokens=64, output=out, progress=False)
    run = prepare(options)
    render_prompts(run)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(run_config(run, "complete", time.time(), None, {})))
    recs = []
    for p in run.tasks[0].problems:
        for i, text in enumerate(_responses(p.gold)):
            extracted = {0: p.gold, 1: "12345", 2: "777", 3: "888"}.get(i)
            recs.append({"task": "math500", "problem_id": p.id, "sample_index": i, "seed": i,
                         "prompt": run.prompts[(p.task, p.id)][0], "prompt_tokens": 10, "response": text,
                         "extracted": extracted, "gold": p.gold, "correct": i == 0, "truncated": False,
                         "finish_reason": "stop", "response_tokens": 5, "gold_parsed": True,
                         "grade_timeout": False, "grade_error": None})
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def _evalkit_in_fresh_process(argv):
    code = ("import json, sys; from rlhf_ext.evalkit.cli import main; rc = main(json.loads(sys.argv[1])); "
            "print('vllm imported:', 'vllm' in sys.modules); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True,
                          timeout=300)


def test_evalkit_records_verdicts_beside_the_rules_and_summarizes_both(judge, tiny_model, tmp_path):
    out = tmp_path / "run"
    run = _finished_run(tiny_model, out)
    argv = ["math500", "--model", str(tiny_model), "--data", str(DATA), "--limit", "2", "--n-samples", "5",
            "--max-tokens", "64", "--output", str(out), "--no-progress", "--verifier-url", judge,
            "--verifier-model", "judge", "--verifier-timeout", "5"]
    proc = _evalkit_in_fresh_process(argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "vllm imported: False" in proc.stdout  # nothing to generate: no engine
    assert "asked 6 of 8 rule-wrong answers (2 without a final answer), 2 judged correct, 2 wrong, 2 failed " \
           "(unreadable 2; the rule verdict stands)" in proc.stderr
    assert len(Judge.requests) == 6
    for body in Judge.requests:  # the final answer only, never the response's text
        assert SECRET_TAIL not in json.dumps(body) and body["model"] == "judge" and body["temperature"] == 0
    problems = {p.id: p for p in run.tasks[0].problems}
    assert any(problems[pid].text[:40] in json.dumps(Judge.requests) for pid in problems)  # the problem is given
    recs = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    by_index = {}
    for r in recs:
        by_index.setdefault(r["sample_index"], []).append(r)
    assert all("verifier" not in r for r in by_index[0])  # right by the rules: never asked
    assert all(r["verifier"]["status"] == "correct" and r["correct"] is False and r["correct_cascade"] is True
               for r in by_index[1])
    assert all(r["verifier"]["status"] == "wrong" and r["correct_cascade"] is False for r in by_index[2])
    assert all(r["verifier"]["status"] == "failed" and r["verifier"]["error"].startswith("unreadable")
               and r["correct_cascade"] is False for r in by_index[3])
    assert all(r["verifier"]["status"] == "skipped" for r in by_index[4])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tasks"]["math500"]["avg@n"]["value"] == pytest.approx(1 / 5)
    assert summary["cascade"]["tasks"]["math500"]["avg@n"]["value"] == pytest.approx(2 / 5)
    c = summary["cascade"]["verifier"]
    assert (c["asked"], c["overturned"], c["upheld"], c["failed"], c["skipped"], c["failures"]) == \
        (6, 2, 2, 2, 2, {"unreadable": 2})
    md = (out / "summary.md").read_text()
    assert "| task | avg@5 rules | avg@5 cascade |" in md and "| math500 | 20.0 [" in md
    assert json.loads((out / "config.json").read_text())["grading"]["verifier"]["model"] == "judge"
    # a rerun asks only what has no verdict yet (the failures)
    proc = _evalkit_in_fresh_process(argv)
    assert proc.returncode == 0 and len(Judge.requests) == 8, proc.stderr
    # the disagreements, for a person: each was wrong by the rules and right by the verifier
    report = run_audit(out, n=10, disagreements=True, write=lambda s: None, read=lambda s: "y")
    assert report["sampled"] == report["judged"] == 2 and report["verifier_right"]["value"] == 1.0
    assert (out / "audit_disagreements.json").exists() and not (out / "audit.json").exists()
    sample = [json.loads(line) for line in (out / "audit_disagreements" / "sample.jsonl").read_text().splitlines()]
    assert {s["extracted"] for s in sample} == {"12345"} and all(s["verifier"]["status"] == "correct" for s in sample)


# --- training rewards: opt-in, never raising, cost in the logs ---

def test_reward_cascade_is_opt_in_never_raises_and_counts_failures(judge, monkeypatch):
    from rlhf_ext.rewards.config import ENV_VERIFIER, RewardConfig, reward_config_from_env
    from rlhf_ext.rewards.openrlhf_protocol import RewardScorer

    spec = {"url": judge, "model": "judge", "timeout": 0.5, "concurrency": 4}
    monkeypatch.setenv(ENV_VERIFIER, json.dumps(spec))
    config = reward_config_from_env()
    assert config.verifier == spec and RewardConfig(verifier=spec).to_env()[ENV_VERIFIER] == json.dumps(spec)
    monkeypatch.setenv(ENV_VERIFIER, json.dumps({"url": judge}))
    with pytest.raises(ValueError, match="verifier settings lack model"):
        reward_config_from_env()
    prompt = "<|im_start|>user\nWhat is 7 + 8?<|im_end|>\n<|im_start|>assistant\n"
    responses = ["\\boxed{15}", "\\boxed{12345}", "\\boxed{777}", "\\boxed{999}", "\\boxed{888}", "no answer"]
    queries = [prompt + r + "<|im_end|>" for r in responses]
    rules = RewardScorer(RewardConfig(reward="accuracy"))
    on = RewardScorer(RewardConfig(reward="accuracy", verifier=spec))
    try:
        off = rules.score(queries, [prompt] * 6, ["15"] * 6)
        assert off["rewards"] == [1.0, 0, 0, 0, 0, 0] and not any(k.startswith("verifier/") for k in off["extra_logs"])
        Judge.requests.clear()
        out = on.score(queries, [prompt] * 6, ["15"] * 6)
        assert out["rewards"] == [1.0, 1.0, 0, 0, 0, 0] and out["scores"] == [1.0, 1.0, 0, 0, 0, 0]
        logs = out["extra_logs"]
        assert logs["verifier/asked"] == [0, 1, 1, 1, 1, 0]  # "no answer": nothing to show the verifier
        assert logs["verifier/overturned"] == [0, 1, 0, 0, 0, 0]
        assert logs["verifier/failed"] == [0, 0, 0, 1, 1, 0]  # the timeout and the garbage: rule verdict stands
        assert 0.4 < logs["verifier/seconds"][3] < 2.5 and logs["reward_flag/error"] == [0.0] * 6
        assert on.verifier_stats.failures == {"timeout": 1, "unreadable": 1}
        assert "What is 7 + 8?" in Judge.requests[0]["messages"][-1]["content"]  # the prompt is the problem
        # OpenRLHF's per-sample calls, scored together
        calls = [([q], [prompt], ["15"]) for q in queries]
        outs = on.score_calls(calls)
        assert [o["rewards"][0] for o in outs] == [1.0, 1.0, 0, 0, 0, 0]
        assert [o["extra_logs"]["verifier/failed"][0] for o in outs] == [0, 0, 0, 1, 1, 0]
        assert on.verifier_stats.asked == 8 and on.verifier_stats.failed == 4
    finally:
        rules.close()
        on.close()


# --- one real vLLM OpenAI-compatible server on the tiny model (~45 s to start on 2 CPU cores) ---

@pytest.fixture(scope="module")
def vllm_verifier(tiny_model):
    port = _closed_port()
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
                             "--served-model-name", "verifier-tiny", "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", "1024", "--enforce-eager", "--kv-cache-memory-bytes", str(64 << 20)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                pytest.fail("the vLLM server died:\n" + proc.stderr.read()[-3000:])
            if time.monotonic() > deadline:
                pytest.fail("the vLLM server did not come up in 300 s")
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_real_vllm_server_as_verifier(vllm_verifier, tiny_model, tmp_path):
    cands = [Candidate("What is 7 + 8?", "15", "\\$15"), Candidate("Name the options.", "A,D", "\\text{A,D}"),
             Candidate("Solve it.", "\\frac12 \\le x \\le 8", "[\\frac12, 8]"), Candidate("p", "1", None)]
    # unconstrained: the random tiny model's reply is rarely a verdict; whatever it is, it is counted
    with VerifierCascade(VerifierSettings(vllm_verifier, "verifier-tiny", timeout=60, concurrency=2)) as cascade:
        free, stats = cascade.verify(cands)
    assert free[3].status == "skipped" and stats.asked == 3
    assert all(v.status in ("correct", "wrong", "failed") and v.prompt_tokens > 20 and v.completion_tokens >= 1
               for v in free[:3])  # the server's usage was read from its real reply
    assert all(v.failure_kind in (None, "unreadable") for v in free[:3])
    assert stats.failed == sum(v.status == "failed" for v in free) and stats.overturned + stats.upheld + \
        stats.failed == 3
    # constrained to the two words by vLLM's structured outputs: every answer gets a verdict
    settings = VerifierSettings(vllm_verifier, "verifier-tiny", timeout=60, concurrency=2, vllm_choice=True)
    with VerifierCascade(settings) as cascade:
        chosen, stats = cascade.verify(cands)
    assert [v.status in ("correct", "wrong") for v in chosen[:3]] == [True] * 3, [v.reply for v in chosen]
    assert stats.failed == 0 and stats.overturned + stats.upheld == 3
    # evalkit with that server: verdicts recorded, both numbers summarized
    out = tmp_path / "run"
    _finished_run(tiny_model, out)
    proc = _evalkit_in_fresh_process(
        ["math500", "--model", str(tiny_model), "--data", str(DATA), "--limit", "2", "--n-samples", "5",
         "--max-tokens", "64", "--output", str(out), "--no-progress", "--verifier-url", vllm_verifier + "/v1",
         "--verifier-model", "verifier-tiny", "--verifier-vllm-choice", "--verifier-timeout", "60"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    asked = [r for r in recs if r.get("verifier", {}).get("status") in ("correct", "wrong")]
    assert len(asked) == 6 and all(r["correct"] is False for r in asked)
    assert all(r["correct_cascade"] == (r["verifier"]["status"] == "correct") for r in asked)
    summary = json.loads((out / "summary.json").read_text())
    overturned = sum(r["verifier"]["status"] == "correct" for r in asked)
    assert summary["cascade"]["verifier"]["overturned"] == overturned
    assert summary["cascade"]["tasks"]["math500"]["avg@n"]["value"] == pytest.approx((2 + overturned) / 10)

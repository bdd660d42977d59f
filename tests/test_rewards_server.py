"""`rlhf-ext reward-server` over real HTTP on loopback: concurrent clients, OpenRLHF's own HTTP client,
4xx for malformed requests, the bounded queue, health, and graceful shutdown of the real command."""

import asyncio
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from rlhf_ext.rewards import RewardConfig
from rlhf_ext.rewards.server import RewardServer

HOSTILE = "\\boxed{9^{9^{9^{9}}}}"
PROMPT = "<|im_start|>user\nWhat is {}+{}?<|im_end|>\n<|im_start|>assistant\n"


def post(url, payload, raw=None, timeout=60):
    data = raw if raw is not None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def get(url, timeout=30):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def sample(a, b, answer, eos=True):
    prompt = PROMPT.format(a, b)
    return prompt + "The answer is \\boxed{%s}." % answer + ("<|im_end|>" if eos else ""), prompt, str(a + b)


@pytest.fixture(scope="module")
def server():
    srv = RewardServer(RewardConfig(reward="math", timeout=5.0, workers=2), port=0, max_batch=64).start()
    yield srv
    srv.shutdown()


def test_concurrent_clients(server):
    results = {}

    def client(i):
        batch = [sample(i, j, i + j if (i + j) % 3 else i + j + 1, eos=j % 2 == 0) for j in range(1 + i % 4)]
        payload = {"query": [b[0] for b in batch], "prompts": [b[1] for b in batch], "labels": [b[2] for b in batch]}
        results[i] = (batch, post(server.url + "/get_reward", payload))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(16))
    for i, (batch, (status, body, headers)) in results.items():
        assert status == 200 and headers["Content-Type"] == "application/json"
        n = len(batch)
        assert len(body["rewards"]) == len(body["scores"]) == n
        for j in range(n):
            right = (i + j) % 3 != 0
            truncated = j % 2 == 1
            assert body["scores"][j] == (1.0 if right else 0.0)
            assert body["rewards"][j] == pytest.approx((1.0 if right else 0.0) + 0.2 - (0.5 if truncated else 0.0))
            assert body["extra_logs"]["reward_flag/truncated"][j] == (1.0 if truncated else 0.0)
    status, health = get(server.url + "/health")
    assert status == 200 and health["status"] == "ok" and health["reward"] == "math"
    assert health["served"] >= 16 and health["in_flight"] == 0 and health["workers"] == 2


def test_openrlhf_http_client_against_the_server(server):
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(remote_rm_url=server.url + "/get_reward")
    query, prompt, label = sample(2, 2, 4)
    (out,) = asyncio.run(executor._fetch_rewards_via_http([query], [prompt], [label]))
    assert out["rewards"] == [pytest.approx(1.2)] and out["scores"] == [1.0]
    assert out["extra_logs"]["reward/accuracy"] == [1.0]


@pytest.mark.parametrize("raw, status, message", [
    (b'{"query": [', 400, "malformed JSON"),
    (b"\xff\xfe", 400, "malformed JSON"),
    (b'["a list"]', 400, "body must be a JSON object"),
    (b'{"prompts": ["p"], "labels": ["1"]}', 400, "missing 'query'"),
    (b'{"query": "q", "prompts": ["p"], "labels": ["1"]}', 400, "'query' must be a list"),
    (b'{"query": ["a", "b"], "prompts": ["a"], "labels": ["1", "2"]}', 400,
     "list lengths differ: 2 queries, 1 prompts, 2 labels"),
    (b'{"query": [1], "prompts": ["p"], "labels": ["1"]}', 400, "'query[0]' must be a string"),
    (json.dumps({"query": ["q"] * 65, "prompts": ["q"] * 65, "labels": ["1"] * 65}).encode(), 413, "exceed the limit"),
])
def test_malformed_requests_get_4xx_with_a_message(server, raw, status, message):
    code, body, _ = post(server.url + "/get_reward", None, raw=raw)
    assert code == status and message in body["error"]


def test_other_http_errors(server):
    code, body, _ = post(server.url + "/nope", {"query": []})
    assert code == 404 and "POST to /get_reward" in body["error"]
    code, body = get(server.url + "/nope")
    assert code == 404
    host, port = server.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.putrequest("POST", "/get_reward")
    conn.endheaders()  # no Content-Length
    resp = conn.getresponse()
    assert resp.status == 411 and "Content-Length" in json.loads(resp.read())["error"]
    conn.close()
    code, body, _ = post(server.url + "/", {"query": [], "prompts": [], "labels": []})  # empty batch is fine
    assert code == 200 and body["rewards"] == []


def test_bounded_queue_rejects_with_retry_after():
    srv = RewardServer(RewardConfig(reward="math", timeout=2.0, workers=1), port=0, max_pending=1).start()
    try:
        slow = {}
        hostile = {"query": ["P" + HOSTILE + "<|im_end|>"], "prompts": ["P"], "labels": ["1"]}
        t = threading.Thread(target=lambda: slow.setdefault("r", post(srv.url, hostile)))
        t.start()
        deadline = time.monotonic() + 30
        while srv._in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert srv._in_flight == 1
        query, prompt, label = sample(1, 1, 2)
        code, body, headers = post(srv.url, {"query": [query], "prompts": [prompt], "labels": [label]})
        assert code == 503 and "server busy" in body["error"] and headers["Retry-After"] == "1"
        t.join(timeout=60)
        code, body, _ = slow["r"]
        assert code == 200 and body["extra_logs"]["reward_flag/timeout"] == [1.0]
        code, body, _ = post(srv.url, {"query": [query], "prompts": [prompt], "labels": [label]})
        assert code == 200 and body["scores"] == [1.0]
        assert get(srv.url + "/health")[1]["rejected"] == 1
    finally:
        srv.shutdown()


def _children(pid):
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out.update(int(c) for c in f.read().split())
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_cli_server_shuts_down_gracefully_on_sigterm():
    cli = os.path.join(os.path.dirname(sys.executable), "rlhf-ext")
    proc = subprocess.Popen([cli, "reward-server", "--port", "0", "--workers", "1", "--timeout", "3",
                             "--log-level", "WARNING"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line and "reward=math" in line
        url = line.split("listening on ")[1].split()[0]
        deadline = time.monotonic() + 60
        while get(url + "/health")[1]["grader"].get("alive", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert len(workers) == 2  # one worker and its spare

        in_flight = {}
        hostile = {"query": ["P" + HOSTILE + "<|im_end|>"], "prompts": ["P"], "labels": ["1"]}
        t = threading.Thread(target=lambda: in_flight.setdefault("r", post(url + "/get_reward", hostile)))
        t.start()
        time.sleep(0.5)  # the request is being graded
        proc.send_signal(signal.SIGTERM)
        t.join(timeout=60)
        code, body, _ = in_flight["r"]
        assert code == 200 and body["extra_logs"]["reward_flag/timeout"] == [1.0]  # answered, not dropped
        assert proc.wait(timeout=60) == 0
        end = time.monotonic() + 20
        while any(_alive(w) for w in workers) and time.monotonic() < end:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers)
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_bad_configuration():
    cli = os.path.join(os.path.dirname(sys.executable), "rlhf-ext")
    out = subprocess.run([cli, "reward-server", "--reward", "acuracy:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown reward 'acuracy'" in out.stderr
    out = subprocess.run([cli, "reward-server", "--timeout", "-1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "positive number of seconds" in out.stderr
    out = subprocess.run([cli, "reward-server", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "OpenRLHF" in out.stdout and "--workers" in out.stdout

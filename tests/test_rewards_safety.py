"""Model text is never run as code: Python payloads in every place an answer (or a gold) is read from,
watched by an audit hook around the exact code a grader worker runs, and by sentinel files through
the real pool, the reward functions and the OpenRLHF reward file."""

import json
import os
import subprocess
import sys
import textwrap

from rlhf_ext.rewards import MathGrader, WeightedReward


def payloads(sentinel_dir):
    s = os.path.join(sentinel_dir, "pwned")
    return [
        f"__import__('os').system('touch {s}_system')",
        f"open('{s}_open', 'w').write('x')",
        f"eval(compile('import os; os.system(\"touch {s}_eval\")', 'x', 'exec'))",
        f"exec('open(\"{s}_exec\", \"w\")')",
        "().__class__.__bases__[0].__subclasses__()",
        f"__import__('subprocess').run(['touch', '{s}_subprocess'])",
    ]


def positions(payload):
    """Every place the grader reads an answer from, and every form a gold can take: (response, gold)."""
    return [
        ("\\boxed{%s}" % payload, "1"),
        ("$\\boxed{1}$ then \\boxed{%s}" % payload, "1"),
        ("<think>\nx\n</think>\n<answer>\n%s\n</answer>" % payload, "1"),
        ("<answer>The answer is %s</answer>" % payload, "1"),
        ("The answer is %s." % payload, "1"),
        ("Final answer: $%s$" % payload, "1"),
        ("#### %s" % payload, "#### 1"),
        ("\\boxed{1}", payload),
        ("\\boxed{1}", "#### %s" % payload),
        ("\\boxed{1}", "so $\\boxed{%s}$" % payload),
        ("\\boxed{%s}" % payload, payload),
    ]


AUDITED = """
import json, os, sys
FORBIDDEN_NAMES = {"__import__", "system", "open", "eval", "exec", "compile", "__subclasses__", "run", "write"}
events = []

def hook(event, args):
    if event == "compile":
        src = args[0]
        if isinstance(src, bytes):
            src = src.decode("utf-8", "replace")
        if isinstance(src, str) and ("pwned" in src or any(n + "(" in src for n in FORBIDDEN_NAMES)):
            events.append([event, src[:200]])
    elif event == "exec":
        code = args[0]
        names = set(getattr(code, "co_names", ()))
        consts = [c for c in getattr(code, "co_consts", ()) if isinstance(c, str)]
        if getattr(code, "co_filename", "") == "<string>" and (names & FORBIDDEN_NAMES or any("pwned" in c for c in consts)):
            events.append([event, sorted(names)])
    elif event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.fork"):
        events.append([event, repr(args)[:200]])
    elif event == "open" and "pwned" in str(args[0]):
        events.append([event, str(args[0])])

import logging
logging.getLogger("math_verify").setLevel(logging.ERROR)
from rlhf_ext.rewards.math_verify_recipe import grade_response
from rlhf_ext.rewards.extraction import extract_answer, prepare_gold
from rlhf_ext.rewards import (format_reward, tag_count_reward, reasoning_steps_reward, repetition_penalty_reward,
                              answer_format_reward)
cases = json.loads(sys.stdin.read())
grade_response("\\\\boxed{1}", "1")  # warm up imports outside the audit
sys.addaudithook(hook)
verdicts = []
for response, gold in cases:
    verdicts.append(grade_response(response, prepare_gold(gold), {}))
    extract_answer(response)
    for fn in (format_reward, tag_count_reward, reasoning_steps_reward, repetition_penalty_reward, answer_format_reward):
        fn([response])
graded_events = list(events)
# Control: the hook does see model text handed to sympy's parser (what math-verify's ExprExtractionConfig does).
from sympy.parsing.sympy_parser import parse_expr
parse_expr("pwned_symbol + 1")
print(json.dumps({"events": graded_events, "control": events[len(graded_events):], "verdicts": verdicts}))
"""


def test_grading_code_compiles_and_runs_no_model_text(tmp_path):
    cases = [case for p in payloads(str(tmp_path)) for case in positions(p)]
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(AUDITED)], input=json.dumps(cases),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["events"] == []
    assert res["control"] and "pwned_symbol" in json.dumps(res["control"])  # the watch works
    assert len(res["verdicts"]) == len(cases) and all(v["gold_parsed"] in (True, False) for v in res["verdicts"])
    assert list(tmp_path.iterdir()) == []
    # the payload is graded as text: boxed/tag/phrase answers are found, and never equal the gold "1"
    for (response, gold), verdict in zip(cases, res["verdicts"]):
        if gold == "1" and response.startswith("\\boxed"):
            assert verdict["extracted"] and not verdict["correct"]


def test_payloads_through_the_pool_the_rewards_and_the_reward_file(tmp_path, monkeypatch):
    cases = [case for p in payloads(str(tmp_path)) for case in positions(p)]
    responses, golds = [c[0] for c in cases], [c[1] for c in cases]
    with MathGrader(timeout=10.0, workers=2, spare_workers=0) as grader:
        results = grader.grade_batch(responses, golds)
        assert len(results) == len(cases) and not any(r.timeout for r in results)
        reward = WeightedReward("accuracy:1,format:1,tag_count:1,reasoning_steps:1,repetition_penalty:1,"
                                "answer_format:1,length:1,cosine:1", grader=grader)
        out = reward(responses, golds, truncated=[False] * len(cases))
        assert len(out.rewards) == len(cases)

    monkeypatch.setenv("RLHF_EXT_REWARD", "math")
    monkeypatch.setenv("RLHF_EXT_REWARD_WORKERS", "1")
    from rlhf_ext.rewards import openrlhf_protocol
    from rlhf_ext.rewards.openrlhf_reward import reward_func

    monkeypatch.setattr(openrlhf_protocol, "_env_scorer", None)
    try:
        for response, gold in cases[:11]:
            got = reward_func(["<|im_start|>assistant\n" + response + "<|im_end|>"], ["<|im_start|>assistant\n"],
                              [gold])
            assert got["extra_logs"]["reward_flag/error"] == 0.0
    finally:
        if openrlhf_protocol._env_scorer is not None:
            openrlhf_protocol._env_scorer.close()
        openrlhf_protocol._env_scorer = None
    assert list(tmp_path.iterdir()) == []  # no payload ran: no sentinel file exists

"""``evalkit run --data FILE --name NAME``: any JSONL as a task (loading, naming, run config; no engine)."""

from __future__ import annotations

import json

import pytest

from rlhf_ext.evalkit.cli import main
from rlhf_ext.evalkit.runner import RunOptions, prepare
from rlhf_ext.evalkit.tasks import DataError, custom_task, load_task


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_custom_task_reads_named_fields_and_normalises_numbers(tmp_path):
    f = _write(tmp_path / "d.jsonl", [{"q": "1+1?", "a": 2.0, "key": "x"}, {"q": "2+2?", "a": "4", "key": "y"}])
    task = custom_task("mine", problem_key="q", answer_key="a", id_key="key")
    data = load_task("mine", f, task=task)
    assert [(p.task, p.id, p.text, p.gold) for p in data.problems] == [("mine", "x", "1+1?", "2"),
                                                                       ("mine", "y", "2+2?", "4")]
    default = load_task("plain", _write(tmp_path / "p.jsonl", [{"problem": "p", "answer": "1"}]),
                        task=custom_task("plain"))
    assert default.problems[0].id == "0"  # no id field: the line position


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "gsm8k"}, "built-in task"),
    ({"name": "bad name"}, "letters, digits"),
    ({"name": "ok", "answer_key": " "}, "--answer-key"),
])  # fmt: skip
def test_custom_task_rejects_bad_names_and_keys(kwargs, message):
    with pytest.raises(DataError, match=message):
        custom_task(**kwargs)


def test_explicit_id_key_must_be_present(tmp_path):
    f = _write(tmp_path / "d.jsonl", [{"problem": "p", "answer": "1"}])
    with pytest.raises(DataError, match="no id"):
        load_task("t", f, task=custom_task("t", id_key="uid"))
    with pytest.raises(DataError, match="no answer .*'label'|no answer"):
        load_task("t", f, task=custom_task("t", answer_key="label"))


def test_prepare_records_the_custom_task_in_the_generation_parameters(tmp_path):
    f = _write(tmp_path / "d.jsonl", [{"prompt": "1+1?", "label": "2"}])
    spec = {"name": "tiny", "problem_key": "prompt", "answer_key": "label", "id_key": None}
    run = prepare(RunOptions(suite="tiny", model="some/model", data=[str(f)], custom_task=spec, output=tmp_path / "o"))
    assert [td.task for td in run.tasks] == ["tiny"] and run.generation["custom_task"] == spec
    other = prepare(RunOptions(suite="tiny", model="some/model", data=[str(f)], output=tmp_path / "o",
                               custom_task={**spec, "answer_key": "prompt"}))
    assert other.generation != run.generation  # another field read = another task: never mixed on resume
    with pytest.raises(ValueError, match="exactly one --data"):
        prepare(RunOptions(suite="tiny", model="m", data=[], custom_task=spec))


def test_cli_errors_are_clear(tmp_path, capsys):
    f = _write(tmp_path / "d.jsonl", [{"problem": "p", "answer": "1"}])
    assert main(["run", "--model", "m", "--data", str(f), "--name", "aime24"]) == 2
    assert "built-in task" in capsys.readouterr().err
    assert main(["run", "--model", "m", "--name", "x"]) == 2
    assert "exactly one --data" in capsys.readouterr().err
    assert main(["run", "--model", "m", "--data", str(tmp_path / "missing.jsonl"), "--name", "x"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["run", "--resume", "--output", str(tmp_path / "nothing")]) == 2
    assert "holds no run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--problem-key" in capsys.readouterr().out

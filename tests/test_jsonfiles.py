"""rlhf_ext.ground.jsonfiles: the one atomic-replace rule and the one strict JSONL reader the tools share."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rlhf_ext.ground.jsonfiles import atomic_writer, iter_jsonl, write_json_atomic, write_text_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_writer(path) as f:
            f.write('{"half": ')
            raise RuntimeError("boom")
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    with pytest.raises(ValueError):  # NaN refused before anything is written
        write_json_atomic(path, {"x": float("nan")}, allow_nan=False)
    assert json.loads(path.read_text()) == {"a": 1}


def test_modes_text_bytes_and_options(tmp_path):
    write_text_atomic(tmp_path / "t.txt", "é\n")
    assert (tmp_path / "t.txt").read_bytes() == "é\n".encode()
    assert stat.S_IMODE(os.stat(tmp_path / "t.txt").st_mode) == 0o644
    write_json_atomic(tmp_path / "m.json", {"k": "é"}, indent=1, mode=0o600, sync_dir=True)
    assert (tmp_path / "m.json").read_text() == '{\n "k": "\\u00e9"\n}\n'
    assert stat.S_IMODE(os.stat(tmp_path / "m.json").st_mode) == 0o600
    with atomic_writer(tmp_path / "b.bin", binary=True) as f:
        f.write(b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"


def test_iter_jsonl_names_file_and_line_and_is_lazy(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n[2]\n{oops\n')
    assert [row for _, row in zip(range(2), iter_jsonl(path))] == [(1, {"a": 1}), (3, [2])]
    with pytest.raises(KeyError, match=r"rows.jsonl:4: not valid JSON \(Expecting property name"):
        list(iter_jsonl(path, KeyError))
    with pytest.raises(ValueError, match=r":4: not JSON"):
        list(iter_jsonl(path, complaint="not JSON"))

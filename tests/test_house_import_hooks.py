"""The one post-import hook module (rlhf_ext.seams.import_hooks), in the cases the two it replaced each handled."""

import sys

import pytest

from rlhf_ext.seams import import_hooks


@pytest.fixture()
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    created = []

    def write(name, body):
        (tmp_path / f"{name}.py").write_text(body)
        created.append(name)
        return name

    yield write
    for name in created:
        sys.modules.pop(name, None)
        import_hooks.clear(name)


def test_callback_registered_by_the_module_itself_runs_once_its_body_is_done(module_dir):
    # A patch that, while its target is still executing under the hook's loader, asks to be told
    # when that module is imported must see the finished module, not a half-built one.
    name = module_dir("rlhf_ext_hook_self", (
        "from rlhf_ext.seams import import_hooks\n"
        "seen = []\n"
        "import_hooks.when_imported(__name__, lambda m: seen.append(('inner', m.LATE)))\n"
        "LATE = 'defined after the registration'\n"
    ))  # fmt: skip
    order = []
    import_hooks.when_imported(name, lambda m: order.append("outer"))
    module = __import__(name)
    assert order == ["outer"]
    assert module.seen == [("inner", "defined after the registration")]
    assert name not in import_hooks.pending_modules()
    assert module.__loader__.__class__.__name__ == "SourceFileLoader"  # the real loader handed back


def test_already_imported_module_gets_the_callback_at_once():
    seen = []
    import_hooks.when_imported("json", lambda m: seen.append(m.__name__))
    assert seen == ["json"] and "json" not in import_hooks.pending_modules()


def test_clear_forgets_callbacks_and_removes_the_finder(module_dir):
    name = module_dir("rlhf_ext_hook_cleared", "VALUE = 1\n")
    seen = []
    others = import_hooks.pending_modules()
    import_hooks.when_imported(name, lambda m: seen.append(m.VALUE))
    assert name in import_hooks.pending_modules()
    assert import_hooks._finder in sys.meta_path
    import_hooks.clear(name)
    assert name not in import_hooks.pending_modules()
    assert (import_hooks._finder in sys.meta_path) == bool(others)  # gone unless other hooks still wait
    __import__(name)
    assert seen == []


def test_a_failing_callback_fails_the_import_statement(module_dir):
    name = module_dir("rlhf_ext_hook_failing", "VALUE = 1\n")

    def broken_patch(module):
        raise RuntimeError("patch does not fit")

    import_hooks.when_imported(name, broken_patch)
    with pytest.raises(RuntimeError, match="patch does not fit"):
        __import__(name)

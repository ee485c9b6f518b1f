"""hotfix.startup.post_import: a post-import hook for a module whose import is in flight runs once that import
has finished, with the whole module; a failed import runs ``failed``; the spec is left as it was.

wrapt's own hook runs at once for a module in ``sys.modules``, also a half-made one (the defects of issue 40:
a fix module importing hotfix at its top, axolotl's module importing transformers first).
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from hotfix.startup import post_import

#: a module that, half-way through its body, asks for a hook on itself (as activation does from inside it)
BODY = """
from hotfix.startup import post_import
import recorder, wrapt
recorder.in_flight.append(post_import.in_flight(__name__))
wrapt.register_post_import_hook(lambda module: recorder.wrapt.append(sorted(n for n in vars(module) if n.isupper())),
                                __name__)
post_import.when_imported(__name__, lambda module: recorder.seen.append(sorted(n for n in vars(module) if n.isupper())),
                          failed=lambda name: recorder.failed.append(name))
EARLY = 1
{tail}
LATE = 2
"""


@pytest.fixture
def modules(tmp_path, monkeypatch):
    recorder = type(sys)("recorder")
    recorder.seen, recorder.failed, recorder.in_flight, recorder.wrapt = [], [], [], []
    monkeypatch.setitem(sys.modules, "recorder", recorder)
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name, tail=""):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(BODY.format(tail=tail)))
        monkeypatch.delitem(sys.modules, name, raising=False)
        return name

    yield write, recorder


def test_a_hook_asked_for_during_the_import_runs_with_the_whole_module(modules):
    write, recorder = modules
    module = importlib.import_module(write("halfway_module"))
    assert recorder.in_flight == [True] and recorder.seen == [["EARLY", "LATE"]]
    assert recorder.wrapt == [[]]  # wrapt's own hook ran at once, on the half-made module
    assert type(module.__spec__).__name__ == "ModuleSpec" and not post_import.in_flight("halfway_module")


def test_a_failed_import_runs_failed_instead(modules):
    write, recorder = modules
    with pytest.raises(ZeroDivisionError):
        importlib.import_module(write("failing_module", tail="1 / 0"))
    assert recorder.seen == [] and recorder.failed == ["failing_module"]


def test_a_whole_module_gets_its_hook_at_once(modules):
    write, recorder = modules
    name = write("whole_module")
    importlib.import_module(name)
    recorder.seen.clear()
    post_import.when_imported(name, lambda module: recorder.seen.append("now"))
    assert recorder.seen == ["now"]

"""The README's third-party fix, taken from the README itself, is a working plugin.

The code block under "A third-party fix" is written to a package with the entry point its
last comment names, beside a ``foo`` library with a ``foo.layers.Bar`` and dist-info at
2.2 (inside the declared range) or 2.4 (its ``fixed_in``).  In a fresh interpreter the
start-up hook activates hotfix on ``import foo.layers`` (a third-party fix is installed):
the fix is applied in range and not outside it, ``hotfix status`` names the distribution
it came from, and revert restores ``Bar.forward`` exactly.
"""

from __future__ import annotations

import re

import pytest

from conftest import REPO, json_lines, run_python

PROBE = """
import json, sys
import foo.layers
import hotfix
original = foo.layers.Bar.__dict__["forward"]
patch = hotfix.known_patches()["foo-bar-keyword"]
wrapped = type(original).__name__
works = foo.layers.Bar().forward(2)
applied = patch.applied_targets
hotfix.revert()
print(json.dumps({"applied": applied, "wrapped": wrapped, "works": works,
                  "restored": foo.layers.Bar.__dict__["forward"] is original.__wrapped__
                  if hasattr(original, "__wrapped__") else True,
                  "source": hotfix.registry.sources.get("foo-bar-keyword")}))
"""


def _readme_fix() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## A third-party fix", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _install(tmp_path, foo_version: str):
    code = _readme_fix()
    entry = re.search(r'\[project\.entry-points\."hotfix\.patches"\] (\S+) = "([^"]+)"', code)
    assert entry, "the README's fix names its entry point in a comment"
    name, value = entry.groups()
    module = value.split(":")[0].split(".")
    package = tmp_path.joinpath(*module[:-1])
    package.mkdir(parents=True)
    for level in range(1, len(module)):
        tmp_path.joinpath(*module[:level], "__init__.py").touch()
    (package / f"{module[-1]}.py").write_text(code)
    info = tmp_path / "my_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[hotfix.patches]\n{name} = {value}\n")
    (tmp_path / "foo").mkdir()
    (tmp_path / "foo" / "__init__.py").write_text(f"__version__ = {foo_version!r}\n")
    (tmp_path / "foo" / "layers.py").write_text("class Bar:\n    def forward(self, x):\n        return x * 3\n")
    foo_info = tmp_path / f"foo-{foo_version}.dist-info"
    foo_info.mkdir()
    (foo_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: foo\nVersion: {foo_version}\n")
    return tmp_path


@pytest.mark.parametrize("foo_version, applied", [("2.2", True), ("2.4", False)])
def test_the_readme_fix_is_a_working_plugin(tmp_path, foo_version, applied):
    proc = run_python(["-c", PROBE], pythonpath=[_install(tmp_path, foo_version)], timeout=120)
    seen = json_lines(proc.stdout)
    assert seen, proc.stderr[-3000:]
    seen = seen[0]
    assert seen["works"] == 6 and seen["source"] == "my-pkg", seen
    assert bool(seen["applied"]) is applied, seen
    assert (seen["wrapped"] == "FunctionWrapper") is applied, seen
    assert seen["restored"] is True, seen
    assert not [line for line in proc.stderr.splitlines() if line.startswith("hotfix:")], proc.stderr

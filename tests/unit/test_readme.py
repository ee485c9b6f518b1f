"""README.md is read in two minutes and names what hotfix fixes (issue 40, defect 3: 157 lines, and its table left
out unsloth-zoo-nonreentrant-offload)."""

from __future__ import annotations

import re
import tomllib

from conftest import REPO


def test_the_readme_is_short_and_its_table_names_every_fix():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    with open(REPO / "pyproject.toml", "rb") as handle:
        fixes = set(tomllib.load(handle)["project"]["entry-points"]["hotfix.patches"])
    table = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.MULTILINE))
    assert table == fixes, (fixes - table, table - fixes)
    for fix in fixes:
        assert f"](docs/fixes/{fix}.md)" in text and (REPO / "docs" / "fixes" / f"{fix}.md").is_file(), fix

"""hotfix_lab.census.add_release: the one command that takes a new release into every census (issue 41, part 4).

Against the committed rows and PyPI's cached dates (no network: ``--no-refresh``): it finds nothing to measure, which
is what the census tests assert row by row; it would measure a release whose rows are missing, in every census that
covers it (census cells, the bisect of a line with several patch releases, DDP, wrapper from 4.52, zoo-nonreentrant
for a new unsloth-zoo release), under every census torch; and the census span ends at the newest cached line.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, clean_env

from hotfix_lab.census import add_release
from hotfix_lab.census import releases


def test_with_the_committed_rows_there_is_nothing_to_measure():
    proc = subprocess.run([sys.executable, "-P", "-m", "hotfix_lab.census.add_release", "--no-refresh", "--dry-run"],
                          env=clean_env(), cwd=str(REPO), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "nothing to measure" in proc.stdout, proc.stdout
    assert f"transformers {releases.transformers_releases()[-1]} is the newest census release" in proc.stdout


def test_the_census_span_ends_at_the_newest_cached_line():
    newest = releases.transformers_releases()[-1]
    assert tuple(int(part) for part in newest.split(".")[:2]) == releases.last_line()
    assert "5.24.0" in releases.transformers_releases()


def test_a_missing_release_is_measured_in_every_census_that_covers_it():
    found = {"transformers": ["5.22.2", "5.24.0"], "unsloth-zoo": ["2026.10.9"], "ddp": ["5.24.0"],
             "wrapper": ["5.24.0"], "zoo-nonreentrant": ["2026.10.9"]}
    commands = [" ".join(command[1:]) for command in add_release.commands("2.13.0", "python", found, 2)]
    census, ddp, wrapper, zoo = (" ".join(module) for module in (add_release.CENSUS, add_release.DDP,
                                                                   add_release.WRAPPER, add_release.ZOO))
    assert commands == [
        f"{census} --dimension transformers --releases 5.22.2,5.24.0 --jobs 2",
        f"{census} --bisect --releases 5.22.2 --jobs 2",  # 5.22 has several patch releases, 5.24 one
        f"{census} --dimension unsloth-zoo --releases 2026.10.9 --jobs 2",
        f"{ddp} --releases 5.24.0 --jobs 2",
        f"{wrapper} --releases 5.24.0 --jobs 2",
        f"{zoo} --releases 2026.10.9 --jobs 2",
    ]
    assert add_release.commands("2.14.1", "python", {tool: [] for tool in found}, 2) == []

"""The protocol every side census follows (forks, ddp, wrapper, deepspeed_census, zoo_nonreentrant): one base.

A side census measures one dimension (a fork's releases, DDP, torch's wrapper, DeepSpeed, unsloth-zoo's
non-reentrant path) without and with hotfix, under the torch it runs on, and keeps its rows in a store of its own:
docs/census/<page>/torch<version>.jsonl.gz (one file per torch line), rendered into docs/census/<page>.md.  What
differs between them is data and two functions, given here once each:

* ``SideCensus(dimension, page, key, tool)``: the rows' dimension, the page's name, the fields that make a row's
  identity (the newest row of an identity is the one kept) and the name the tool prints;
* ``@census.page``: the function that renders the page's lines from every row (``census.render`` writes them);
* ``@census.describes``: a row in one line, printed as it is measured.

The cycle (``measure_and_render``: what the rows lack, measured on a pool of jobs, then compacted and rendered),
the command line of a census measured per transformers release and half (``per_release_main``), a case's verdict
(``verdict_of``), the rows of the dimension by identity (``rows``) and the fix's declared mechanism (``declared``)
are the same for each.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from hotfix_lab.census import runner
from hotfix_lab.infra.paths import REPO
from hotfix_lab.sweep import sweep_store

Row = Dict


def verdict_of(result: Optional[Dict], why: str, equal_detail: Callable[[Dict], str]) -> Tuple[str, str]:
    """A case's result as (verdict, detail): error (no result: ``why``), crash (its error), equal (``equal_detail``
    of it), wrong (its summary)."""
    if result is None:
        return "error", why
    if not result.get("ok"):
        return "crash", result.get("error", "")
    if result.get("equal"):
        return "equal", equal_detail(result)
    return "wrong", result.get("summary", "")


class SideCensus:
    """One side census: its dimension, store, page, row identity, and the cycle that fills them."""

    def __init__(self, dimension: str, page: str, key: Sequence[str], tool: str):
        self.dimension = dimension
        self.store = REPO / "docs" / "census" / page
        self.doc = REPO / "docs" / "census" / f"{page}.md"
        self.key_fields = tuple(key)
        self.tool = tool
        self._section: Optional[Callable[[List[Row]], List[str]]] = None
        self._describe: Optional[Callable[[Row], str]] = None

    # -- what a census module gives ----------------------------------------------------------------------------
    def page(self, section: Callable[[List[Row]], List[str]]) -> Callable[[List[Row]], List[str]]:
        """Decorator: the page's lines from every row."""
        self._section = section
        return section

    def describes(self, describe: Callable[[Row], str]) -> Callable[[Row], str]:
        """Decorator: a row in one line (printed as the row is measured)."""
        self._describe = describe
        return describe

    # -- the rows --------------------------------------------------------------------------------------------
    def key(self, row: Row) -> tuple:
        """A row's identity in the store."""
        return tuple(row[field] for field in self.key_fields)

    @staticmethod
    def group(row: Row) -> str:
        """The store's file of a row: one per torch line."""
        return f"torch{row['torch']}"

    def rows(self, all_rows: List[Row], where: Callable[[Row], bool] = lambda row: True) -> Dict[tuple, Row]:
        """This dimension's rows (those ``where`` keeps) by identity."""
        return {self.key(r): r for r in all_rows if r.get("dimension") == self.dimension and where(r)}

    def render(self, all_rows: List[Row], doc: Path) -> None:
        doc.write_text("\n".join(self._section(all_rows)).rstrip() + "\n")

    @staticmethod
    def declared(patch, name: str) -> Tuple[Optional[object], List[str]]:
        """The fix's mechanism ``name``, or None and the gate's one problem: it is not declared."""
        mechanism = next((m for m in patch.mechanisms if m.name == name), None)
        return mechanism, [] if mechanism is not None else [f"{name}: not declared by {patch.name}"]

    # -- the cycle -------------------------------------------------------------------------------------------
    def compact(self, results: Path) -> None:
        sweep_store.compact(results, self.key, self.group)

    def measure_and_render(self, args: argparse.Namespace,
                           jobs: Callable[[str, List[Row], runner.RowSink], List]) -> int:
        """Unless --render-only, ``jobs(torch, rows, sink)`` (what the rows of this torch lack) on --jobs threads,
        then the rows compacted into the store; then the page."""
        results = Path(args.results)
        if not args.render_only:
            torch = runner.torch_release()
            runner.run_jobs(jobs(torch, runner.read_rows(results), runner.RowSink(results, torch, self._describe)),
                            args.jobs, self.tool)
            self.compact(results)
        self.render(runner.read_rows(results), Path(args.doc))
        print(f"{self.tool}: {args.doc}")
        return 0

    def per_release_main(self, argv, description: str, releases: List[str],
                         run_release: Callable[[str, bool, runner.RowSink, float], None]) -> int:
        """A census measured one transformers release and half (hotfix off, on) per job (ddp, wrapper): its
        command line (--releases, --remeasure and the store's options) and its cycle."""
        p = argparse.ArgumentParser(description=description)
        p.add_argument("--releases", default="", help="comma list: only these transformers releases")
        p.add_argument("--remeasure", action="store_true", help="run the chosen releases again even where rows "
                                                               "exist (the newest row of a cell is the one kept)")
        runner.add_store_arguments(p, self.store, self.doc, 300.0, "seconds per release and half")
        args = p.parse_args(argv)
        only = set(filter(None, args.releases.split(",")))

        def jobs(torch: str, rows: List[Row], sink) -> List:
            done = set() if args.remeasure else {(r["release"], r["hotfix"]) for r in rows
                                                 if r["torch"] == torch and r["verdict"] != "error"}
            return [lambda r=release, h=hotfix: run_release(r, h, sink, args.timeout)
                    for release in releases for hotfix in (False, True)
                    if (not only or release in only) and (release, hotfix) not in done]

        return self.measure_and_render(args, jobs)

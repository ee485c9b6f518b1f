"""The census rows against the ranges each fix declares (``Mechanism.affected`` / ``fixed_in``).

Per (dimension, torch, mechanism, release) the census gives an upstream state and a with-hotfix state
(cells.state: broken / fine / n/a / error over the mechanism's cells and both checkpoint functions).
A declared range is equal to the evidence when:

* every release measured broken upstream is inside the range, unless the mechanism declares it
  ``unreached`` (``hotfix.patch.Mechanism``: it has the bug, the fix does not act there, and
  ``hotfix status`` says "NOT COVERED");
* every release measured fine upstream is outside the range, or measured fine with hotfix too (the
  fix is a proven no-op there);
* where every measured release from some release on is fine after one broken before it (upstream
  fixed the mechanism), the range ends there: none of those releases is inside it;
* every release inside the range measured broken with hotfix is one the mechanism declares ``lost``
  (``hotfix.patch.Lost``: upstream drops its state before the fix sees it; ``hotfix status`` says "NOT
  COVERED" there), and every release it declares lost that was measured is broken with hotfix; both per
  model where a declaration names its models (``Lost.model_types``: Gemma-4's cells answer for Gemma-4's).

``problems(rows, patches)`` lists every disagreement, one sentence each (tests/versions/test_version_gates.py);
the compile column declares no range: ``compile_problems(rows)`` lists every compile case where hotfix
breaks what upstream runs, or changes dynamo's counts.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from hotfix_lab.census.cells import state
from hotfix_lab.census.releases import builtin_fixes  # noqa: F401  (gates.builtin_fixes: tests/versions/test_version_gates.py)

DISTRIBUTION = {"transformers": "transformers", "unsloth-zoo": "unsloth-zoo"}

def verdicts(rows: Iterable[Dict]) -> Dict[Tuple[str, str, str, str], Dict[str, str]]:
    """(dimension, torch, mechanism, release) -> {"upstream": state, "hotfix": state}."""
    grouped: Dict[tuple, Dict[bool, List[str]]] = {}
    for row in rows:
        key = (row["dimension"], row["torch"], row["mechanism"], row["release"])
        grouped.setdefault(key, {False: [], True: []})[row["hotfix"]].append(row["verdict"])
    return {key: {"upstream": state(found[False]), "hotfix": state(found[True])} for key, found in grouped.items()}


def _declared(patches) -> Dict[str, object]:
    return {mechanism.name: mechanism for patch in patches for mechanism in patch.mechanisms}


def _holds(ranges, dimension: str, release: str) -> bool:
    """Does ``ranges`` (a mechanism's ``affected`` or ``unreached``) hold ``release`` of ``dimension``?"""
    spec = ranges.get(DISTRIBUTION[dimension])
    return spec is not None and SpecifierSet(spec).contains(Version(release), prereleases=True)


def problems(rows: Iterable[Dict], patches) -> List[str]:
    rows = list(rows)
    declared = _declared(patches)
    found = verdicts(rows)
    out: List[str] = []
    series: Dict[tuple, List[Tuple[Version, str, str]]] = {}
    for (dimension, torch, name, release), states in sorted(found.items()):
        if dimension not in DISTRIBUTION:  # the compile column: compile_problems()
            continue
        mechanism = declared.get(name)
        if mechanism is None:
            out.append(f"census rows name mechanism {name!r}, which no fix declares")
            continue
        if DISTRIBUTION[dimension] not in mechanism.affected:
            continue
        inside = _holds(mechanism.affected, dimension, release)
        upstream, fixed = states["upstream"], states["hotfix"]
        series.setdefault((dimension, torch, name), []).append((Version(release), release, upstream))
        if upstream == "broken" and not inside and not _holds(mechanism.unreached, dimension, release):
            out.append(f"{name}: {dimension} {release} (torch {torch}) is broken upstream but outside the declared "
                       f"range {mechanism.affected[DISTRIBUTION[dimension]]}")
        if upstream == "fine" and inside and fixed != "fine":
            out.append(f"{name}: {dimension} {release} (torch {torch}) is fine upstream and inside the range, but not "
                       f"fine with hotfix ({fixed})")
    for (dimension, torch, name), points in series.items():
        points.sort()
        measured = [(v, release, s) for v, release, s in points if s in ("broken", "fine")]
        broken_at = [i for i, (_, _, s) in enumerate(measured) if s == "broken"]
        if not broken_at or broken_at[-1] == len(measured) - 1:
            continue
        fixed_from = measured[broken_at[-1] + 1][1]
        inside_after = [release for _, release, _ in measured[broken_at[-1] + 1:]
                        if _holds(declared[name].affected, dimension, release)]
        if inside_after:
            out.append(f"{name}: fixed upstream from {dimension} {fixed_from} (torch {torch}; every measured release "
                       f"after is fine), but the range still holds {', '.join(inside_after)}")
    return out + _lost_problems(rows, declared)


def _lost_problems(rows: List[Dict], declared: Dict[str, object]) -> List[str]:
    """The gate on ``Mechanism.lost``, per model: the cells of a model broken with hotfix inside the range are
    declared lost for that model (or for any), and each declaration holding a measured release is measured broken
    with hotfix there, over the cells of the models it names (every cell of the mechanism where it names none)."""
    from hotfix_lab.census.cells import model_type_of

    with_hotfix: Dict[tuple, Dict[Optional[str], List[str]]] = {}  # (dimension, torch, mechanism, release) ->
    for row in rows:                                                 # model type -> verdicts
        if row["hotfix"] and row["dimension"] in DISTRIBUTION and row["mechanism"] in declared:
            models = with_hotfix.setdefault((row["dimension"], row["torch"], row["mechanism"], row["release"]), {})
            models.setdefault(model_type_of(row.get("case", "")), []).append(row["verdict"])
    out: List[str] = []
    for (dimension, torch, name, release), models in sorted(with_hotfix.items()):
        mechanism = declared[name]
        for model, found in sorted(models.items(), key=str):
            if state(found) == "broken" and DISTRIBUTION[dimension] in mechanism.affected \
                    and _holds(mechanism.affected, dimension, release) \
                    and _lost_at(mechanism, dimension, release, model) is None:
                out.append(f"{name}: {dimension} {release} (torch {torch}) is broken with hotfix"
                           f"{f' ({model})' if model else ''}, but the mechanism does not declare it lost there "
                           f"(hotfix status would not say NOT COVERED)")
        for lost in mechanism.lost:
            found = [verdict for model, verdicts_ in models.items() if _names(lost, model) for verdict in verdicts_]
            if _holds(lost.affected, dimension, release) and state(found) == "fine":
                named = f" for {', '.join(lost.model_types)}" if lost.model_types else ""
                out.append(f"{name}: {dimension} {release} (torch {torch}) is declared lost upstream{named}, but measured "
                           f"fine with hotfix")
    return out


def _names(lost, model_type: Optional[str]) -> bool:
    """Is a cell of ``model_type`` one ``lost`` is about (it names that model, or no model)?"""
    return not lost.model_types or model_type in lost.model_types


def _lost_at(mechanism, dimension: str, release: str, model_type: Optional[str] = None):
    """The mechanism's ``Lost`` declaration that holds ``release`` of ``dimension`` (and, given ``model_type``,
    names that model or any model), or None."""
    return next((lost for lost in mechanism.lost if _holds(lost.affected, dimension, release)
                 and (model_type is None or _names(lost, model_type))), None)


def lost_reason(mechanism_name: str, dimension: str, release: str, patches, model_type: Optional[str] = None
                ) -> Optional[str]:
    """The reason of the mechanism's ``Lost`` declaration that holds ``release`` for ``model_type`` (None: any
    model), else None."""
    mechanism = _declared(patches).get(mechanism_name)
    lost = _lost_at(mechanism, dimension, release, model_type) if mechanism and dimension in DISTRIBUTION else None
    return lost.reason if lost else None


def compile_problems(rows: Iterable[Dict], known=None, open_defects=None) -> List[str]:
    """Compile cells where hotfix is worse than upstream: not equal where upstream is, or other dynamo counts
    (except on the torch lines ``known`` lists: default cells.COMPILE_DIFFERS_WITH_HOTFIX, each with its reason),
    outside the torch lines ``open_defects`` names (default cells.COMPILE_OPEN_DEFECTS: hotfix breaks compile
    there, an open defect the page lists with its reason)."""
    from hotfix_lab.census.cells import COMPILE_COUNTS, COMPILE_DIFFERS_WITH_HOTFIX, COMPILE_OPEN_DEFECTS

    known = COMPILE_DIFFERS_WITH_HOTFIX if known is None else known
    open_defects = COMPILE_OPEN_DEFECTS if open_defects is None else open_defects

    pairs: Dict[tuple, Dict[bool, Dict]] = {}
    for row in rows:
        if row["dimension"] == "compile":
            pairs.setdefault((row["torch"], row["release"], row["function"], row["case"]), {})[row["hotfix"]] = row
    out = []
    for (torch, release, function, case), pair in sorted(pairs.items()):
        if len(pair) != 2:
            out.append(f"{case}: torch {torch}, transformers {release}, {function}: measured with hotfix "
                       f"{'on' if True in pair else 'off'} only")
            continue
        off, on = pair[False], pair[True]
        if torch in open_defects:
            continue
        if off["verdict"] == "equal" and on["verdict"] != "equal":
            out.append(f"{case}: torch {torch}, transformers {release}, {function}: upstream equal, with hotfix "
                       f"{on['verdict']} ({on['detail']})")
        changed = [f"{key} {off.get(key)} -> {on.get(key)}" for key in COMPILE_COUNTS if off.get(key) != on.get(key)]
        if changed and off["verdict"] not in ("n/a", "crash") and on["verdict"] != "crash" and torch not in known:
            out.append(f"{case}: torch {torch}, transformers {release}, {function}: hotfix changes {', '.join(changed)}")
    return out

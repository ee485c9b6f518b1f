"""Command line: ``hotfix status`` (default), ``hotfix doctor``, ``hotfix check-model``, ``hotfix --version``.

``python -m hotfix`` is the same command.  Bad input is one ``hotfix`` line on stderr and an
exit status, never a traceback: a reader that stops reading (``hotfix status | head -1``)
ends the output quietly, Ctrl-C is one line and status 130.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from typing import List, Optional

from hotfix.config import DISABLE_VAR, DISABLED_PATCHES_VAR, normalize_patch_name
from hotfix.diagnostics.compare import short_error
from hotfix.diagnostics.step import CheckerError
from hotfix.quiet_stdout import QuietWhenReaderGone
from hotfix.registry import registry
from hotfix.startup.status import startup_hook
from hotfix.status import fix_statuses
from hotfix.versions import REPORTED_LIBRARIES, reader


def _import_targets(patches) -> dict:
    """Import each installed target so `status` can say what is applied.

    A target that refuses to import here (unsloth_zoo without a GPU, say) is
    reported, not raised.
    """
    problems = {}
    for patch in patches.values():
        for target in patch.targets:
            top = target.split(".")[0]
            if not reader.evidence(top.replace("_", "-"), top).found or target in sys.modules:
                continue
            try:
                importlib.import_module(target)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # some libraries raise SystemExit without a GPU
                problems[target] = short_error(exc)
    return problems


def status(import_targets: bool = True, out=None, verbose: bool = False) -> int:
    """``hotfix status``: the rendering of ``hotfix.status.fix_statuses`` and what surrounds it."""
    out = out or sys.stdout
    import hotfix

    write = lambda text="": print(text, file=out)  # noqa: E731
    patches = registry.patches()
    problems = _import_targets(patches) if import_targets and registry.active else {}
    # this process's own state: a script's process may differ (it is asked there: `import hotfix_state`)
    write(f"hotfix {hotfix.__version__} (distribution hotfix-checkpoint), in this `hotfix status` process (your "
          f"script's own: `import hotfix_state; print(hotfix_state.report())` in it):  "
          f"{'active' if registry.active else 'INACTIVE'}")
    write("start-up hook: " + startup_hook(os.path.dirname(hotfix.__file__), registry.settings.disabled))
    write("libraries: " + "; ".join(f"{dist} {reader.evidence(dist, module).describe()}"
                                    for dist, module in REPORTED_LIBRARIES.items()))
    write(f"opt-out: {DISABLE_VAR}={os.environ.get(DISABLE_VAR, '')!r}"
          + (" (hotfix disabled)" if registry.settings.disabled else "")
          + f"  {DISABLED_PATCHES_VAR}={os.environ.get(DISABLED_PATCHES_VAR, '')!r}")
    for error in registry.load_errors.values():
        write(f"failed to load: {error}")
    for waiting in registry.waiting.values():
        write(f"not loaded yet: {waiting}")
    write("patches:")
    for fix in fix_statuses(registry, problems):
        write(f"  {fix.name}: {fix.state}  (from {fix.source})")
        if verbose:
            describe_fix(patches[normalize_patch_name(fix.name)], write)
    if not verbose:
        write("(hotfix status --verbose: what each fix repairs, where, and why it applies here or not)")
    return 0


def describe_fix(patch, write) -> None:
    verdict = patch.check()
    write(f"    fixes:    {patch.symptom}")
    if patch.details:
        write(f"    covers:   {patch.details}")
    if patch.declaration_error():  # its ranges cannot be listed: the state line says why
        write(f"    upstream: {patch.upstream}")
        return
    here = {m.name for m in patch.mechanisms_here()}
    for mechanism in patch.mechanisms:
        ranges = ", ".join(f"{dist} {spec}" for dist, spec in mechanism.affected.items())
        ranges += "".join(f"; not reached: {dist} {spec}" for dist, spec in mechanism.unreached.items())
        ranges += "".join(f"; lost upstream: {dist} {spec}" for lost in mechanism.lost
                          for dist, spec in lost.affected.items())
        write(f"    {'[here] ' if mechanism.name in here else '       '}{mechanism.name} ({ranges}): {mechanism.summary}")
    write(f"    here:     {'applies' if verdict.applies else 'does not apply'}: {verdict.reason}")
    uncovered = patch.uncovered_here()
    if uncovered:
        write(f"    NOT COVERED: {uncovered}")
    write(f"    upstream: {patch.upstream}; fixed in: {patch.fixed_in or 'no release yet'}")


def _error_line(exc: BaseException) -> str:
    """One line for an exception from the user's code (``SystemExit(7)`` named as such: its text is just "7")."""
    if isinstance(exc, SystemExit):
        return f"it raised SystemExit({exc.code!r})"
    if isinstance(exc, CheckerError):  # hotfix's own one-line reason
        return str(exc)
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _number(what: str, low: float, above: bool):
    """argparse type: a finite float >= low (> low where ``above``), or one usage line naming ``what``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


def _byte_size(text: str) -> int:
    """argparse type of --memory-limit: a size such as 4GiB, or one usage line (never a traceback)."""
    import argparse

    from hotfix.diagnostics.memory import parse_bytes

    try:
        size = parse_bytes(text)
    except ValueError:
        size = 0
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size in bytes (e.g. 4GiB, 512M, 1000000)")
    return size


def _add_check_arguments(p) -> None:
    p.add_argument("target", help="MODULE:CALLABLE or FILE.py:CALLABLE; the callable takes no arguments and returns "
                   "(model, batch), (model, batch, loss_fn) or a dict with keys model, batch[, loss_fn]")
    p.add_argument("--modes", default="reentrant,non-reentrant,default",
                   help="comma list of reentrant, non-reentrant, default (default: all three)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rtol", type=_number("a relative tolerance (a number >= 0)", 0, False), default=None,
                   help="relative tolerance (default: by dtype)")
    p.add_argument("--floor", type=_number("a fraction >= 0", 0, False), default=None,
                   help="fraction of the whole gradient's norm used as the least error scale (default 1e-3)")
    p.add_argument("--memory-limit", type=_byte_size, default=None,
                   help="RSS growth allowed per step, e.g. 4GiB (default: min(50%% of available memory, 8 GiB))")
    p.add_argument("--time-limit", type=_number("a number of seconds > 0", 0, True), default=600.0,
                   help="seconds per step (default 600)")
    p.add_argument("--grace", type=_number("a number of seconds >= 0", 0, False), default=60.0,
                   help="seconds a step over its limit gets to stop before the process exits with status 3 "
                        "(default 60)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--verbose", action="store_true", help="list every parameter")
    p.add_argument("--compare-hotfix", action="store_true",
                   help="run the check twice in fresh interpreters, with HOTFIX_DISABLE=1 and with hotfix active")


def check_model_command(args) -> int:
    import json

    from hotfix.diagnostics.checker import MODES, check_model
    from hotfix.diagnostics.compare import FLOOR
    from hotfix.diagnostics.factory import load_factory, unpack_factory_result

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        print(f"hotfix check-model: unknown mode(s) {', '.join(bad)}; known: {', '.join(MODES)}", file=sys.stderr)
        return 2
    if args.compare_hotfix:
        passthrough = [args.target, "--modes", ",".join(modes), "--seed", str(args.seed),
                       "--time-limit", str(args.time_limit), "--grace", str(args.grace)]
        for flag, value in (("--rtol", args.rtol), ("--floor", args.floor), ("--memory-limit", args.memory_limit)):
            if value is not None:
                passthrough += [flag, str(value)]
        from hotfix.diagnostics.children import check_model_child

        results = {"without hotfix (HOTFIX_DISABLE=1)": check_model_child(passthrough, disabled=True),
                   "with hotfix": check_model_child(passthrough, disabled=False)}
        if args.json:
            print(json.dumps(results))
        else:
            for label, data in results.items():
                print(f"{label}: {data.get('verdict')}")
                for m in data.get("modes", []):
                    print(f"  {m['mode']:<14} {m['summary']}")
        status = results["with hotfix"].get("exit_status")
        return status if status in (0, 1, 2, 3) else 2  # the with-hotfix half decides (documented)
    try:
        factory = load_factory(args.target)
        model, batch, loss_fn = unpack_factory_result(factory())
    except (Exception, SystemExit) as exc:  # the user's code may call sys.exit(): still "could not check"
        print(f"hotfix check-model: could not build model and batch from {args.target}: {_error_line(exc)}",
              file=sys.stderr)
        return 2
    try:
        report = check_model(
            model, batch, loss_fn=loss_fn, modes=modes, seed=args.seed, rtol=args.rtol,
            floor=FLOOR if args.floor is None else args.floor,
            memory_limit=args.memory_limit,
            time_limit=args.time_limit, grace=args.grace,
        )
    except CheckerError as exc:
        print(f"hotfix check-model: {exc}", file=sys.stderr)
        return 2
    except (Exception, SystemExit) as exc:  # a model that breaks the check itself, or exits from a step
        print(f"hotfix check-model: could not check {args.target}: {_error_line(exc)}", file=sys.stderr)
        return 2
    if args.json:
        data = report.to_dict()
        if args.verbose:
            data["per_parameter"] = report.per_parameter
        print(json.dumps(data))
    else:
        print(report.format(verbose=args.verbose))
    if report.safe:
        return 0
    return 2 if report.reference.status != "reference" or not report.supported else 1


#: 128 + SIGINT: the status a shell reports for a program ended by Ctrl-C
INTERRUPTED = 130


def _version() -> str:
    """``hotfix --version``: the distribution, its version, where this command runs from, and the Python."""
    import hotfix

    python = ".".join(map(str, sys.version_info[:3]))
    return f"hotfix-checkpoint {hotfix.__version__} from {os.path.dirname(hotfix.__file__)} (Python {python})"


class _PrintVersion(argparse.Action):
    """``--version``: the line as it is (argparse's own action wraps it at the terminal's width, splitting a path)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
        parser.exit()


def main(argv: Optional[List[str]] = None) -> int:
    """The ``hotfix`` command; returns its exit status (argparse exits with 2 on a usage error)."""
    stdout = sys.stdout
    if stdout is not None:  # None under pythonw: print() already writes nowhere
        sys.stdout = QuietWhenReaderGone(stdout)
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("hotfix: interrupted", file=sys.stderr)
        return INTERRUPTED
    finally:
        if stdout is not None:
            sys.stdout.flush()  # here, not in the interpreter's last flush, where a gone reader is a traceback
            sys.stdout = stdout


def _run(argv: Optional[List[str]]) -> int:
    parser = argparse.ArgumentParser(prog="hotfix", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_PrintVersion, help="the version, where it runs from, the Python")
    sub = parser.add_subparsers(dest="command")
    p_status = sub.add_parser("status", help="versions, known patches, what is applied here")
    p_status.add_argument("--no-import", action="store_true",
                          help="do not import target libraries (faster; shows pending patches)")
    p_status.add_argument("--verbose", "-v", action="store_true",
                          help="what each fix repairs (its mechanisms and their ranges), why it applies here or not")
    sub.add_parser("doctor", help="reproduce the Whisper bug here without and with hotfix")
    p_check = sub.add_parser(
        "check-model", help="is gradient checkpointing safe for YOUR model? one step per mode, gradients compared",
        description="Run one training step without checkpointing and one per checkpointing mode on the model "
        "and batch returned by TARGET, and compare every parameter gradient. A parameter without a gradient is "
        "never equal to one whose gradient is zero. Exit status: 0 safe, 1 unsafe (missing/wrong gradients, "
        "crash, memory/time guard), 2 could not check (no model, no loss, the step without checkpointing fails, "
        "no mode supported, TARGET failed or returned something else than documented), 3 a step overran its "
        "guard inside one call and the process was ended, 130 interrupted (Ctrl-C). "
        "With --compare-hotfix the exit status is the with-hotfix run's (the run without hotfix is shown "
        "for comparison only).",
    )
    _add_check_arguments(p_check)
    args = parser.parse_args(argv)
    if args.command == "check-model":
        return check_model_command(args)
    if args.command == "doctor":
        from hotfix.diagnostics.doctor import main as doctor_main

        return doctor_main([])
    return status(import_targets=not getattr(args, "no_import", False), verbose=getattr(args, "verbose", False))


if __name__ == "__main__":
    sys.exit(main())

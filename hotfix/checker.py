"""Public import path of the checker: ``from hotfix.checker import check_model`` (README).

The code lives in ``hotfix/diagnostics/`` (checker.py, step.py, results.py, ...).
"""

from hotfix.diagnostics.checker import MODES, CheckerError, CheckReport, ModeResult, check_model

__all__ = ["check_model", "CheckReport", "ModeResult", "CheckerError", "MODES"]

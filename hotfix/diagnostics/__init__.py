"""Diagnostics: is checkpointing right for a model?  Nothing here runs during training.

``from hotfix.diagnostics import check_model`` (the checker's public entry point, loaded on
first use: importing this package imports no torch).

``checker``     check_model(): the comparison engine (one step without checkpointing,
                one per mode, every gradient compared) -- used by check-model, doctor,
                the tests and the sweep
``compare``     the one gradient comparison and tolerance rule; short_error()
``step``, ``modes``, ``model_state``, ``results``   the engine's parts
``guard``, ``memory``   memory/time guard of a step; RSS readers; byte sizes
``factory``     check-model TARGET: the user's model factory
``doctor``, ``doctor_models``   ``hotfix doctor`` and its tiny Whisper
``children``    fresh interpreters with and without hotfix, and their JSON lines
``startup``     ``hotfix status``: is the start-up hook in effect in this interpreter, and if not, why
"""

_PUBLIC = ("check_model", "CheckReport", "ModeResult", "CheckerError", "MODES")
__all__ = list(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        from hotfix.diagnostics import checker

        return getattr(checker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

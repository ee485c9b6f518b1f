"""Diagnostics: is checkpointing right for a model?  Nothing here runs during training.

``checker``     check_model(): the comparison engine (one step without checkpointing,
                one per mode, every gradient compared) -- used by check-model, doctor,
                the tests' case runner and the sweep
``compare``     the one gradient comparison and tolerance rule; short_error()
``step``, ``modes``, ``model_state``, ``results``   the engine's parts
``guard``, ``memory``   memory/time guard of a step; RSS readers; byte sizes
``factory``     check-model TARGET: the user's model factory
``doctor``      ``hotfix doctor``
``children``    fresh interpreters with and without hotfix, and their JSON lines
``tiny_models`` the tiny random-weight models (imports no hotfix)
"""

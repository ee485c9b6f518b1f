"""NOT bitsandbytes.nn: the GPU kit's stand-in.  Holds only ``Linear4bit``, for ``isinstance`` checks."""

from . import MESSAGE

STAND_IN = True


class Linear4bit:
    """No module is a bitsandbytes 4-bit layer here: ``isinstance(x, Linear4bit)`` is always False."""

    def __init__(self, *args, **kwargs):
        raise ImportError(MESSAGE.format(name="nn.Linear4bit"))


def __getattr__(name):
    raise AttributeError(MESSAGE.format(name=f"nn.{name}"))

"""NOT bitsandbytes: the GPU kit's stand-in (tools/hotfix_lab/gpu/unsloth_standins/README.md says why and what).

``import bitsandbytes`` succeeds and ``bitsandbytes.nn.Linear4bit`` exists; any other name
raises AttributeError naming this stand-in, and there is no ``functional`` / ``optim`` /
``cextension`` submodule, so code that probes them sees no bitsandbytes.
"""

#: transformers reads a package's __version__ where it finds no metadata: below every minimum it asks for,
#: so it reports bitsandbytes as not available
__version__ = "0.0.0+standin"
STAND_IN = True  # unsloth_flow.py lists the stand-ins that were imported by this marker
MESSAGE = ("bitsandbytes.{name} is not available: this is the hotfix GPU kit's stand-in for bitsandbytes "
           "(tools/hotfix_lab/gpu/unsloth_standins), not bitsandbytes; 4-bit / 8-bit loading cannot work here")


def __getattr__(name):
    raise AttributeError(MESSAGE.format(name=name))

from . import nn  # noqa: E402  (bnb.nn.Linear4bit must resolve as an attribute too: peft reads it so)

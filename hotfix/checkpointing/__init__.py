"""The checkpoint engine the fixes share: what a checkpointed call holds, and how hotfix rewrites it.

Nothing here is a fix and nothing here applies itself: the fixes (``hotfix.patches``) import what they
need when they first apply, by which time their targets have imported torch.  Importing this package
imports nothing (activation never imports torch).

    slot          the class-level stand-in for ``module._gradient_checkpointing_func`` (and its coverage)
    slot_fix      the base of the fixes that act on that function (coverage, drift check, lazy wrapper)
    structure     what a call's arguments and outputs hold (containers, Caches); private_copy: mappings
    inputs        tensors hidden from a reentrant checkpoint become its inputs; the 0-byte anchor
    outputs       nested outputs returned flat and connected; unused outputs left without gradient
    shared_state  what a layer writes into a mapping or Cache it is handed, replayed onto the caller's
    layer_call    which layer a call runs; hotfix's wrappers of a call show it
    ddp           is a DistributedDataParallel forward searching for unused parameters; parameters as checkpoint inputs
    torch_wrapper a layer under torch's checkpoint_wrapper, handed to transformers' own checkpointing for one call
    unsloth       what the fixes rely on in unsloth-zoo's UnslothCheckpointFunction
    deepspeed     what the fixes rely on in DeepSpeed's checkpoint function; a layer call put the way it handles it
    torch_checkpoint  where every call of torch's checkpoint ends (names, the generator's shape)
    forks         LlamaFactory's / axolotl's copies of unsloth's checkpointer, called with every input connected
    region        which checkpointed call code runs in, its forward or a recomputation (entered by every call site)
    routing       an MoE's topk recorded in a region's forward, replayed in its recomputation
    explain       what runs for one checkpointed call of a layer, outermost first (for a developer)
    offload/      the activation offloader (host memory, streams) and its devices
"""

#: what reentrant checkpointing says when a tensor with a history reaches a layer past its inputs (the seed reports'
#: error; the fixes' ``symptom`` lines start with it)
BACKWARD_TWICE = "RuntimeError: Trying to backward through the graph a second time"

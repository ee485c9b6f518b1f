"""Helpers shared by the text families (``text_*`` modules): the shrunk depth, per-layer lists cut to
it (keeping one layer of each kind), setting only the attributes a release's config has, and
``head_dim`` left None by the big defaults.  No tables: the model types are in the ``text_*`` modules.
"""

from __future__ import annotations

# ----------------------------------------------------------------------------------------- helpers


def _layers(config) -> int:
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return 2


def _cover(values, n):
    """``n`` entries of a per-layer list, in order, with each distinct kind at least once when n allows."""
    values = list(values)
    if len(values) <= n:
        return values
    keep = []
    for i, v in enumerate(values):  # first occurrence of each kind
        if v not in [values[j] for j in keep]:
            keep.append(i)
    for i in range(len(values)):  # then fill from the front
        if len(keep) >= n:
            break
        if i not in keep:
            keep.append(i)
    return [values[i] for i in sorted(keep[:n])]


def _cut_layer_lists(config, n=None, names=None):
    """Cut every per-layer list attribute (built for the default depth) to the shrunk depth."""
    n = n or _layers(config)
    for key, value in list(vars(config).items()):
        if names is not None and key not in names:
            continue
        if isinstance(value, list) and len(value) > n and (names is not None or key.endswith("_types")
                                                          or "block_type" in key):
            setattr(config, key, _cover(value, n))


def _set(config, **values):
    """Set only the attributes the config (of this release) has."""
    for key, value in values.items():
        if hasattr(config, key):
            setattr(config, key, value)


def _head_dim(config):
    """head_dim left None (derived from the big defaults in __init__, or never derived): hidden / heads."""
    config.head_dim = config.hidden_size // config.num_attention_heads

"""Text models with state-space / recurrent / short-conv mixers, alone or beside attention: Mamba2, Bamba,
GraniteMoeHybrid, Falcon-H1, Jamba, Zamba, Zamba2, LFM2-MoE, xLSTM.

The generic shrink sets each size field small on its own; these families tie several together:

* Mamba2-style mixers: ``n_heads x head_dim = expand x hidden`` and ``chunk_size`` (the SSD scan
  allocates chunk-sized tensors), small ``d_state``.
* which layers are mixers and which attention (``attn_layer_indices``, ``layer_types``,
  ``layers_block_type``, periods and offsets) is set for the shrunk depth, one layer of each kind.
* the fast paths need mamba-ssm CUDA kernels (switched off); a few defaults only checkpoints fill
  (lfm2_moe's layer kinds) and a release bug worked around on the config (xlstm), each said where it is done.
Shared helpers are in ``_text_common``.
"""

from __future__ import annotations

from ._text_common import _cut_layer_lists, _set


def _ssd(config, prefix="mamba_", heads=4, state=16, chunk_len=4, **names):
    """Mamba2 (SSD) mixer sizes: heads x head size = expand x hidden; a small state; a chunk the 8-token
    batch spans twice (the torch scan pads to and allocates chunk x chunk tensors per head: 256 is huge).
    ``names`` maps the size kinds to a config whose fields do not follow the ``mamba_*`` pattern."""
    inner = getattr(config, prefix + "expand", None) or getattr(config, "expand", 2)
    inner = inner * config.hidden_size
    keys = dict(n_heads=prefix + "n_heads", d_head=prefix + "d_head", d_state=prefix + "d_state",
                n_groups=prefix + "n_groups", chunk=prefix + "chunk_size", dt_rank=prefix + "dt_rank")
    keys.update(names)
    _set(config, **{keys["n_heads"]: heads, keys["d_head"]: inner // heads, keys["d_state"]: state,
                    keys["n_groups"]: 1, keys["chunk"]: chunk_len, keys["dt_rank"]: 4})


# ------------------------------------------------------------------------------------------ fixes


def _fix_bamba(config):
    # mamba layers with one attention layer (index 1) in a 2-layer stack
    _ssd(config)
    config.attn_layer_indices = [1]


def _fix_granitemoehybrid(config):
    # one mamba layer, one attention layer (the default is all mamba); the kind names changed in 5.x
    _ssd(config)
    _set(config, shared_intermediate_size=32)
    if "linear_attention" in (getattr(config, "layer_types", None) or []):
        config.layer_types = ["linear_attention", "full_attention"]
    else:
        config.layer_types = ["mamba", "attention"]


def _fix_falcon_h1(config):
    # mamba_d_ssm (1024) is the mixer width (heads x head size), not derived from hidden: tie it
    _ssd(config, heads=8)
    _set(config, mamba_d_ssm=config.mamba_n_heads * config.mamba_d_head)


def _fix_mamba2(config):
    _ssd(config, prefix="", n_heads="num_heads", d_head="head_dim", d_state="state_size", chunk="chunk_size",
         dt_rank="time_step_rank")


def _fix_jamba(config):
    # the fast path needs mamba-ssm CUDA kernels; attention on layer 1, experts on layer 1
    _set(config, use_mamba_kernels=False, mamba_dt_rank=4, attn_layer_period=2, attn_layer_offset=1,
         expert_layer_period=2, expert_layer_offset=1)


def _fix_zamba(config):
    # two hybrid layers (mamba + the one shared attention block, tied across hybrid layers: 5.x refuses a
    # single hybrid layer, its tie pattern finds nothing to tie); attention width is 2 x hidden
    _set(config, use_mamba_kernels=False, mamba_dt_rank=4, n_mamba_heads=2, attn_layer_period=1,
         attn_layer_offset=0, attention_hidden_size=2 * config.hidden_size,
         attention_head_dim=2 * config.hidden_size // config.num_attention_heads)
    config.layers_block_type = ["hybrid"] * config.num_hidden_layers


def _fix_zamba2(config):
    _ssd(config, n_heads="n_mamba_heads", d_head="mamba_headdim", n_groups="mamba_ngroups", chunk="chunk_size")
    _set(config, use_mamba_kernels=False, attention_hidden_size=2 * config.hidden_size,
         attention_head_dim=2 * config.hidden_size // config.num_attention_heads, adapter_rank=8,
         kv_channels=config.hidden_size // config.num_attention_heads, num_query_groups=config.num_attention_heads)
    _cut_layer_lists(config, names=("layers_block_type",))
    if hasattr(config, "hybrid_layer_ids"):
        config.hybrid_layer_ids = [i for i, kind in enumerate(config.layers_block_type) if kind == "hybrid"]


def _fix_lfm2_moe(config):
    # layer_types defaults to None (checkpoints list them): one short-conv layer, one attention layer;
    # the first num_dense_layers are dense, the rest MoE
    config.layer_types = ["conv", "full_attention"]
    _set(config, num_dense_layers=1, num_experts=4, num_experts_per_tok=2)


def _fix_xlstm(config):
    # embedding_dim / num_blocks were copied from the 4096-wide, 32-block defaults in __init__.  4.5x's
    # chunkwise kernel is broken (calls a tensor: vecM_k_combine(...)); in the default "inference" mode a
    # sequence shorter than chunk_size skips it for the recurrent kernel.  5.x: two chunks of 4 tokens
    import transformers

    major = int(transformers.__version__.split(".")[0])
    _set(config, embedding_dim=config.hidden_size, num_blocks=config.num_hidden_layers,
         chunk_size=16 if major < 5 else 4)


CONFIGS = {
    "xlstm": _fix_xlstm,
    "lfm2_moe": _fix_lfm2_moe,
    "bamba": _fix_bamba,
    "granitemoehybrid": _fix_granitemoehybrid,
    "falcon_h1": _fix_falcon_h1,
    "mamba2": _fix_mamba2,
    "jamba": _fix_jamba,
    "zamba": _fix_zamba,
    "zamba2": _fix_zamba2,
}

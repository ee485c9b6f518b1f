"""Text decoders with multi-head latent attention and / or mixture-of-experts routers: DeepSeek V2 / V3 /
V3.2 and their kin (GLM-MoE-DSA, A.X K1/K2, HY V4, Youtu, MiniCPM3), LongCat-Flash, Kimi Linear,
MiMo-V2-Flash, dots1, Hunyuan V1, DBRX.

The generic shrink sets each size field small on its own; these families tie several together:

* MLA (DeepSeek-style) attention: ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim`` and the rotary
  ``head_dim`` is the rope slice (both derived once in the config's ``__init__`` from the big defaults);
  grouped routers need experts divisible into ``n_group`` groups of at least two; sparse indexers
  (DSA) carry their own head count / size / top-k.
* per-layer lists (``layer_types``, ``mlp_layer_types``, ...) were built for the default depth and
  must be cut to ``num_hidden_layers`` (keeping one layer of each kind, dense and MoE both run).
* a few defaults only checkpoints fill (expert counts, ``head_dim``) and a release bug worked around on
  the config (dbrx), each said where it is done.
Shared helpers are in ``_text_common``.
"""

from __future__ import annotations

from ._text_common import _cut_layer_lists, _head_dim, _layers, _set


def _mla(config, nope=8, rope=8, v=16, lora=16):
    """Multi-head latent attention: the derived q/k head size and the rotary size follow the parts."""
    _set(config, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, kv_lora_rank=lora)
    if getattr(config, "q_lora_rank", None):
        config.q_lora_rank = lora
    if hasattr(config, "qk_head_dim"):
        config.qk_head_dim = nope + rope
    if hasattr(config, "head_dim"):
        config.head_dim = rope  # the rotary embedding reads head_dim: the rope slice


def _router(config, experts=4, per_token=2):
    """Grouped top-k routers take the top-2 inside each group: one group of all the experts."""
    _set(config, n_routed_experts=experts, num_experts=experts, num_local_experts=experts,
         num_experts_per_tok=per_token)
    _set(config, n_group=1, topk_group=1)
    if hasattr(config, "first_k_dense_replace"):
        config.first_k_dense_replace = 1  # layer 0 dense, layer 1 MoE: both paths run


def _indexer(config):
    """DSA sparse indexer: few small heads; top-k below the 8-token batch so the sparse selection runs."""
    _set(config, index_n_heads=2, index_head_dim=16, index_topk=4)


def _mlp_kinds(config):
    if hasattr(config, "mlp_layer_types"):
        n = _layers(config)
        config.mlp_layer_types = (["dense"] + ["sparse"] * n)[:n]


# ------------------------------------------------------------------------------------------ fixes


def _fix_mla_moe(config):
    _mla(config)
    _router(config)
    _indexer(config)
    _cut_layer_lists(config)
    _mlp_kinds(config)


def _fix_longcat_flash(config):
    # each of the num_layers decoder layers holds two MLA sublayers; routing picks moe_topk of the real
    # experts plus zero_expert_num identity ("zero") experts
    _mla(config)
    _set(config, ffn_hidden_size=64, expert_ffn_hidden_size=32, n_routed_experts=4, zero_expert_num=2, moe_topk=2,
         num_layers=1)
    if "num_hidden_layers" in vars(config):  # 4.57 stores it; 5.x derives it as 2 x num_layers
        config.num_hidden_layers = 2 * config.num_layers


def _fix_kimi_linear(config):
    # MLA full-attention layers + KDA linear-attention layers (own head count/size); one layer of each.
    # Also Bailing-hybrid, the same mix: with its KDA width left at 128, one step grows past 1 GiB.
    _mla(config)
    _router(config)
    _set(config, linear_num_heads=2, linear_head_dim=16)
    _cut_layer_lists(config)
    _mlp_kinds(config)


def _fix_mimo_v2_flash(config):
    # sliding layers use twice the kv heads of full layers: 4 query heads over 2 (full) / 4 (sliding)
    _router(config)
    _set(config, num_attention_heads=4, num_key_value_heads=2, head_dim=16, v_head_dim=16, sliding_window=4)
    _cut_layer_lists(config)
    _mlp_kinds(config)
    # the default 0.334 of a 16-wide head is an odd 5 rotary dims: half the head instead
    for params in (getattr(config, "rope_parameters", None) or {}).values():
        if isinstance(params, dict) and "partial_rotary_factor" in params:
            params["partial_rotary_factor"] = 0.5


def _fix_hunyuan_v1(config):
    _head_dim(config)
    _set(config, num_experts=4, moe_topk=2)  # MoE variant: the default of one expert routes nothing


def _fix_dots1(config):
    # the expert counts default to None (only the checkpoints set them)
    _set(config, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
         max_window_layers=config.num_hidden_layers)
    _cut_layer_lists(config)


def _fix_dbrx(config):
    # 5.x DbrxAttention still reads attn_config.rope_theta, which 5.x moved into config.rope_parameters
    # and clamps qkv with clip_qkv even when it is None (the default): set the checkpoints' clip of 8
    attn = config.attn_config
    if not hasattr(attn, "rope_theta"):
        attn.rope_theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    attn.clip_qkv = 8.0
    ffn = config.ffn_config
    _set(ffn, ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2)


CONFIGS = {
    "dbrx": _fix_dbrx,
    "hunyuan_v1_dense": _fix_hunyuan_v1,
    "hunyuan_v1_moe": _fix_hunyuan_v1,
    "dots1": _fix_dots1,
    "mimo_v2_flash": _fix_mimo_v2_flash,
    "longcat_flash": _fix_longcat_flash,
    "kimi_linear": _fix_kimi_linear,
    "bailing_hybrid": _fix_kimi_linear,
    "deepseek_v2": _fix_mla_moe,
    "deepseek_v3": _fix_mla_moe,
    "deepseek_v32": _fix_mla_moe,
    "glm_moe_dsa": _fix_mla_moe,
    "axk1": _fix_mla_moe,
    "axk2": _fix_mla_moe,
    "hy_v4": _fix_mla_moe,
    "youtu": _fix_mla_moe,
    "minicpm3": _fix_mla_moe,
}

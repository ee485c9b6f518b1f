"""A patched forward for tests/support/moe_block.py's ``Block``, as unsloth-zoo's temporary patches write them: a
function of another module put in the class's place, routing in a module-level helper it calls by name
(``_route_softmax_topk(self, router_logits, top_k)`` in unsloth-zoo's ``moe_grouped_modulelist``)."""

from __future__ import annotations

import torch

from moe_block import TOP_K, WIDTH


def route_softmax_topk(self, logits, top_k):
    probs = torch.softmax(logits, dim=-1)
    weights, chosen = torch.topk(probs, top_k, dim=-1)
    return weights, chosen


def forward(self, x):
    flat = x.reshape(-1, WIDTH)
    weights, chosen = route_softmax_topk(self, self.gate(flat), TOP_K)
    out = torch.zeros_like(flat)
    for expert in torch.unique(chosen).tolist():  # only the experts that were hit: shapes follow the routing
        rows, slot = torch.where(chosen == expert)
        out.index_add_(0, rows, self.experts[expert](flat[rows]) * weights[rows, slot, None])
    return x + out.reshape(x.shape)

"""A plain-torch mixture of experts for the routing replay's in-process tests (tests/unit/test_moe_routing_replay.py).

Its own module: moe-routing-replay replaces a routing module's global ``torch`` (the tests put it back).  The
block loops over the experts that were hit, as transformers 4.x and most Hub models do (a recomputation that routes
otherwise runs other shapes: non-reentrant checkpointing fails); ``GroupRouter`` picks with ``Tensor.topk`` under
``@torch.no_grad()`` (DeepSeek's and GLM's group routers: reached through the method, not the module's torch);
``sample_experts``, a module-level helper that samples (PhiMoE's kind: reached as a helper its callers read here).
"""

from __future__ import annotations

import torch
from torch import nn

EXPERTS, TOP_K, WIDTH = 6, 2, 8


def sample_experts(scores):
    """A router that samples (the shape of PhiMoE's ``sparsemixer``, not its code): each token's first expert its
    best score, its second drawn by Gumbel noise among the others; the weights the softmax's at those."""
    first = scores.max(dim=-1, keepdim=True)[1]
    others = scores.scatter(-1, first, float("-inf"))
    second = (others - torch.empty_like(others).exponential_().log()).max(dim=-1, keepdim=True)[1]
    chosen = torch.cat([first, second], dim=-1)
    return torch.softmax(scores, dim=-1).gather(-1, chosen), chosen


class Block(nn.Module):
    def __init__(self, method: bool = False, sampling: bool = False):
        super().__init__()
        self.gate = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.experts = nn.ModuleList([nn.Linear(WIDTH, WIDTH) for _ in range(EXPERTS)])
        self.router = GroupRouter() if method else None
        self.sampling = sampling

    def forward(self, x):
        flat = x.reshape(-1, WIDTH)
        if self.sampling:
            weights, chosen = sample_experts(self.gate(flat))
            return self._experts(x, flat, weights, chosen)
        probs = torch.softmax(self.gate(flat), dim=-1)
        if self.router is not None:
            chosen = self.router.choose(probs)
            weights = probs.gather(1, chosen)
        else:
            weights, chosen = torch.topk(probs, TOP_K, dim=-1)
        return self._experts(x, flat, weights, chosen)

    def _experts(self, x, flat, weights, chosen):
        out = torch.zeros_like(flat)
        for expert in torch.unique(chosen).tolist():  # only the experts that were hit: shapes follow the routing
            rows, slot = torch.where(chosen == expert)
            out.index_add_(0, rows, self.experts[expert](flat[rows]) * weights[rows, slot, None])
        return x + out.reshape(x.shape)


class GroupRouter(nn.Module):
    @torch.no_grad()
    def choose(self, probs):
        return probs.topk(TOP_K, dim=-1).indices


class Model(nn.Module):
    def __init__(self, method: bool = False, layers: int = 2, sampling: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList([Block(method, sampling) for _ in range(layers)])
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x, checkpoint=None):
        for block in self.blocks:
            x = checkpoint(block, x) if checkpoint is not None else block(x)
        return self.head(x).sum()

"""hotfix.checkpointing.offload.offloader and the replacement checkpoint Function, in this process, on CPU.

The offloader runs on tools/hotfix_lab/infra/simulated_device.py's SimulatedDevice: real copies between CPU
tensors, with every wait / copy / allocation logged, so the stream ordering,
buffer reuse and schedule are checked without a GPU.  The checkpoint methods
are bound to a Function class defined here (no unsloth needed).
"""

from __future__ import annotations

import functools
import gc as garbage

import pytest
import torch

from hotfix.checkpointing.offload.offloader import OFFLOAD_MESSAGE, ActivationOffloader, CudaDevice
from hotfix_lab.infra.simulated_device import SimulatedDevice
from hotfix.patches.unsloth_zoo_offload_backward import build_checkpoint_methods


def _offloader(threshold=0):
    said = []
    offloader = ActivationOffloader(SimulatedDevice(), threshold_bytes=threshold, announce=said.append)
    return offloader, said


def _fake_step(offloader, sizes):
    """One forward over layers with the given input sizes, then backward in reverse."""
    tickets = []
    for n in sizes:
        x = torch.randn(n, requires_grad=True)
        ticket = offloader.offload(x)
        offloader.after_forward(ticket)
        tickets.append((ticket, x.detach().clone()))
    for ticket, original in reversed(tickets):
        offloader.backward_started()
        if ticket is not None:
            assert torch.equal(offloader.reload(ticket), original)


def test_schedule_reuse_message_and_order():
    offloader, said = _offloader()
    device = offloader.device
    allocations = []
    for _ in range(3):
        _fake_step(offloader, [1024, 1024, 1024])
        allocations.append(device.allocations("host"))
    assert offloader.stats.offloaded == {1: [1, 2, 3], 2: [1, 2], 3: [1, 2]}
    assert offloader.stats.kept == {2: [3], 3: [3]}  # the last layer, once known
    assert allocations == [3, 3, 3]  # step 1 allocates, steps 2 and 3 reuse
    assert said == [OFFLOAD_MESSAGE]
    assert offloader.staging_allocations == 1
    log = device.log
    for i, entry in enumerate(log):
        if entry[0] == "copy":
            assert entry[2] == "side"
            assert log[i - 1] == ("wait", "side", "compute")
            if entry[1] == "to_device":
                assert log[i + 1] == ("wait", "compute", "side")
    # after each copy-out, compute waits for side (at the end of that layer's forward)
    to_host = [i for i, e in enumerate(log) if e[:2] == ("copy", "to_host")]
    assert all(("wait", "compute", "side") in log[i + 1:i + 3] for i in to_host)


def test_threshold_is_in_bytes_and_exclusive():
    offloader, said = _offloader(threshold=4 * 256)  # fp32: 256 elements = threshold
    _fake_step(offloader, [256, 257])
    assert offloader.stats.kept == {1: [1]} and offloader.stats.offloaded == {1: [2]}


def test_buffer_comes_back_when_graph_is_dropped():
    offloader, _ = _offloader()
    ticket = offloader.offload(torch.randn(64, requires_grad=True))
    buffer = ticket.lease.buffer
    del ticket  # the graph holding the ticket is dropped without backward
    garbage.collect()
    again = offloader.offload(torch.randn(64, requires_grad=True))
    assert again.lease.buffer is buffer  # the lease came back to the pool and is lent again
    assert offloader.device.allocations("host") == 1


def test_bigger_request_replaces_instead_of_growing_the_pool():
    offloader, _ = _offloader()
    pool = offloader.pool(torch.device("cpu"))
    small = pool.acquire(10)
    small.release()
    big = pool.acquire(10 * 1024 * 1024)
    assert pool.allocations == 2  # nothing free fitted: a new buffer
    big.release()
    small_again = pool.acquire(10)
    assert small_again.buffer is big.buffer and pool.allocations == 2  # the small one was dropped, not kept


def test_pool_takes_a_buffer_of_a_mixed_size_free_list():
    """list.remove compared buffers with == (elementwise on tensors): with free buffers of two sizes (Whisper's
    encoder and decoder activations), taking one that was not first raised 'The size of tensor a ... must match'.
    Found by the stream-ordering cases (tests/versions/test_offload_stream_order.py)."""
    from hotfix.checkpointing.offload.devices import HostBufferPool

    pool = HostBufferPool(lambda n: torch.empty(n, dtype=torch.uint8))
    big, small = pool.acquire(200 * 1024), pool.acquire(64 * 1024)
    big.release()
    small.release()
    taken = pool.acquire(10)
    assert taken.buffer is small.buffer  # the smallest that fits, though not first in the list
    grown = pool.acquire(300 * 1024)  # none fits: the largest too-small one (big) is dropped
    assert pool.allocations == 3 and grown.buffer.numel() >= 300 * 1024
    grown.release()
    assert pool.acquire(10).buffer is grown.buffer and pool.allocations == 3  # big is gone, grown is reused


def _function_class(offloader):
    forward, backward = build_checkpoint_methods(offloader)
    return type("UnslothCheckpointFunction", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def test_gradients_rng_frozen_first_and_nested():
    """Dropout (RNG replay), a frozen args[0], and a checkpoint nested in a checkpoint."""
    offloader, said = _offloader()
    F = _function_class(offloader)
    torch.manual_seed(0)
    lin1, lin2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
    w = torch.randn(4, 16, requires_grad=True)

    def inner(h):
        return torch.nn.functional.dropout(torch.tanh(lin2(h)), 0.5, training=True)

    def outer(h, w, nested):
        y = torch.tanh(lin1(h)) * w
        return F.apply(inner, True, y) if nested else inner(y)

    def run(checkpointed):
        for p in (*lin1.parameters(), *lin2.parameters(), w):
            p.grad = None
        h0 = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))  # frozen
        torch.manual_seed(7)
        out = F.apply(functools.partial(outer, nested=True), True, h0, w) if checkpointed else outer(h0, w, False)
        out.sum().backward()
        return [p.grad.clone() for p in (*lin1.parameters(), *lin2.parameters(), w)]

    reference = run(False)
    candidate = run(True)
    for ref, got in zip(reference, candidate):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-7)
    # The outer call's args[0] is frozen: nothing to offload.  The inner call
    # only becomes a graph node inside the outer recomputation, where its input
    # needs grad; it must not offload there (its reload would overwrite the
    # staging buffer the outer layer reads), nor count as a layer.
    assert offloader.stats.offloaded == {} and offloader.stats.kept == {} and said == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device_round_trip():
    offloader = ActivationOffloader(CudaDevice(), threshold_bytes=0, announce=lambda s: None)
    x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
    ticket = offloader.offload(x)
    offloader.after_forward(ticket)
    assert ticket.lease.buffer.is_pinned()
    offloader.backward_started()
    assert torch.equal(offloader.reload(ticket), x.detach())

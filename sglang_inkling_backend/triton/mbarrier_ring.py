"""Ring arithmetic of the warp-specialized Hopper kernel's mbarriers (``decode_hopper_ws``), in plain Python so that
the kernel (through ``gluon.jit``) and its hand-over model (tests/triton_tests/test_hopper_ws_protocol.py) run the
same function.

Use ``i`` of a ring of ``n`` buffers (K/V stages, P' sets) is buffer ``i % n``; its barrier completes one phase per
use, so use ``i`` completes phase ``i // n`` of that buffer's barrier, whose parity ``(i // n) & 1`` is what a
consumer waits for (``mbarrier.try_wait.parity`` passes once the phase of that parity has completed). A producer
refilling the buffer waits for the previous use's release, the flipped parity, which a fresh barrier passes (it
counts as having completed the phase of parity 1 before its first)."""


def ring_slot(i, n):
    """(buffer, phase parity) of use ``i`` of a ring of ``n`` buffers."""
    return i % n, (i // n) & 1

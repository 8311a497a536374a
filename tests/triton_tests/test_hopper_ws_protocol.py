"""The warp-specialized Hopper kernel's hand-over (``decode_hopper_ws``) as a model, run on the CPU: its two
partitions' mbarrier operations and shared-memory reads and writes, in the kernel's order and with the kernel's ring
arithmetic (``mbarrier_ring.ring_slot``), under many random interleavings and TMA completion orders. Every run must
finish (no deadlock) and every read must see the tile it expects, written before and not yet overwritten (no race).
The same model with a wrong parity or a missing wait fails, so the checks can fail.

mbarrier model (PTX): a barrier counts completed phases; a phase completes when its pending arrivals and its
expected transaction bytes both reach zero (``mbarrier.arrive.expect_tx`` adds bytes and arrives; a TMA landing
subtracts them); ``try_wait.parity p`` passes once the phase of parity p has completed, i.e. while the current
(incomplete) phase's parity differs from p, so a fresh barrier passes parity 1."""

import random

import pytest

pytest.importorskip("triton", reason="Triton is not installed (the kernel package imports it)")

from sglang_inkling_backend.triton.mbarrier_ring import ring_slot  # noqa: E402


class Barrier:
    def __init__(self, count=1):
        self.count, self.pending, self.tx, self.completed = count, count, 0, 0

    def _maybe_complete(self):
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.count

    def arrive(self):
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count"
        self._maybe_complete()

    def expect(self, nbytes):
        self.tx += nbytes
        self.arrive()

    def land(self, nbytes):
        self.tx -= nbytes
        self._maybe_complete()

    def passes(self, parity):
        return (self.completed & 1) != parity


class Race(AssertionError):
    pass


def run_model(n_tiles, stages, p_sets, seed, ring=ring_slot, value_waits_ready=True):
    """One interleaving of the kernel's prologue, softmax partition, value partition and TMA landings."""
    rng = random.Random(seed)
    kv_ready = [Barrier() for _ in range(stages)]
    p_ready = [Barrier() for _ in range(p_sets)]
    p_empty = [Barrier() for _ in range(p_sets)]
    o_ready = Barrier()
    stage_tile = [None] * stages  # the tile whose K and V a stage holds (None: being written or empty)
    k_read = {}  # tile -> the softmax warpgroup finished its K dots
    v_read = {}  # tile -> the value warpgroup finished its V dots
    p_tile = [None] * p_sets
    p_read = {}
    in_flight = []  # TMA copies issued, not landed: (stage, tile)
    final = {}

    def issue_tma(stage, tile):
        prev = tile - stages
        if prev >= 0 and not (k_read.get(prev) and v_read.get(prev)):
            raise Race(f"TMA of tile {tile} into stage {stage} while tile {prev} is still read")
        stage_tile[stage] = None
        in_flight.append((stage, tile))

    def wait_for_tile(i, reader):
        """Both partitions' first step of tile i: wait for its stage, then read it (returns the stage)."""
        stage, phase = ring(i, stages)
        yield lambda: kv_ready[stage].passes(phase)
        if stage_tile[stage] != i:
            raise Race(f"{reader} of tile {i}: stage {stage} holds {stage_tile[stage]}")
        return stage

    def softmax():
        for i in range(n_tiles):
            yield from wait_for_tile(i, "softmax read K")
            k_read[i] = True
            ps, pphase = ring(i, p_sets)
            yield lambda: p_empty[ps].passes(pphase ^ 1)
            prev = i - p_sets
            if prev >= 0 and not p_read.get(prev):
                raise Race(f"P' of tile {i} overwrites set {ps} before tile {prev}'s V dots read it")
            p_tile[ps] = i
            p_ready[ps].arrive()
        final["factors"] = True
        o_ready.arrive()

    def value():
        for i in range(n_tiles):
            stage = yield from wait_for_tile(i, "value read V (first half)")
            ps, pphase = ring(i, p_sets)
            if value_waits_ready:
                yield lambda: p_ready[ps].passes(pphase)
            if p_tile[ps] != i or stage_tile[stage] != i:
                raise Race(f"value's V dots of tile {i} read P' of {p_tile[ps]} and V of {stage_tile[stage]}")
            v_read[i] = True
            p_read[i] = True
            p_empty[ps].arrive()
            if i + stages < n_tiles:
                kv_ready[stage].expect(2)
                issue_tma(stage, i + stages)
        yield lambda: o_ready.passes(0)
        if not final.get("factors"):
            raise Race("output stored before the final factors")
        final["stored"] = True

    for s in range(min(stages, n_tiles)):  # the prologue: every stage's first tile
        kv_ready[s].expect(2)
        issue_tma(s, s)
    parts = {"softmax": softmax(), "value": value()}
    waiting = {name: (lambda: True) for name in parts}  # each partition's current wait (a predicate)
    while parts or in_flight:
        choices = [name for name in parts if waiting[name]()] + (["tma"] if in_flight else [])
        if not choices:
            raise AssertionError(f"deadlock: {sorted(parts)} wait, no copy in flight")
        pick = rng.choice(choices)
        if pick == "tma":
            stage, tile = in_flight.pop(rng.randrange(len(in_flight)))
            stage_tile[stage] = tile
            kv_ready[stage].land(2)
            continue
        try:
            waiting[pick] = next(parts[pick])  # runs the partition up to its next wait
        except StopIteration:
            del parts[pick]
    return final


@pytest.mark.parametrize("stages, p_sets", [(3, 1), (2, 1), (2, 2), (3, 2), (4, 1)])
def test_the_hand_over_finishes_and_reads_each_tile_it_expects(stages, p_sets):
    for n_tiles in range(0, 9):
        for seed in range(60):
            final = run_model(n_tiles, stages, p_sets, seed=seed * 1000 + n_tiles)
            assert final == {"factors": True, "stored": True}


def test_the_model_catches_a_wrong_parity_and_a_missing_wait():
    def unflipped(i, n):  # the consumer's parity off by one phase
        buf, phase = ring_slot(i, n)
        return buf, phase ^ 1

    with pytest.raises(AssertionError):
        for seed in range(50):
            run_model(6, 3, 1, seed=seed, ring=unflipped)
    with pytest.raises(Race):  # V dots without waiting for P'
        for seed in range(200):
            run_model(6, 3, 1, seed=seed, value_waits_ready=False)

"""A speculative verify step in the core (``attention_inputs.SpecVerify``): each request's draft tokens attend its
cached prefix and the drafts their tree mask lets them see, at positions prefix + depth. The reference against a
dense float64 softmax written here with plain loops (random trees from parent pointers; bf16 and MXFP8 pools; with
and without a window; Inkling's relative bias; GQA 2); a chain is a plain extend bit for bit; the mask matters; the
torch route and ``layer_step`` carry it; a route without ``serves_verify`` refuses it; every bad input is refused,
naming it. The Triton route's kernel: ``tests/triton_tests/test_triton_extend_verify.py``."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from sglang_inkling_backend import InklingKVPool, LayerPlan, layer_step
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify
from sglang_inkling_backend.checks import UnsupportedFeature
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend.rails import KVRails, window_start
from sglang_inkling_backend.reference.attention import paged_extend_attention
from sglang_inkling_backend.reference.draft_trees import chain_tree as chain, random_parents, tree_from_parents as tree_of
from sglang_inkling_backend.routes import TorchRoute
from sglang_inkling_backend.step_plans import DecodePlanCache

HQ, HKV, D = 4, 2, 64  # GQA 2
PREFIX, DRAFTS = [9, 3, 14], [7, 5, 6]  # per request: cached keys, draft tokens
REL_EXTENT = 8


def spec_verify(masks, depths) -> SpecVerify:
    return SpecVerify.from_trees(zip(masks, depths))


def dense_float64(q, k, v, prefix, mask, depths, scale, window=None, rel=None):
    """One request: q [n, Hq, D] (its drafts), k/v [prefix + n, Hkv, D] (dequantized), plain float64 loops."""
    n, hq, _ = q.shape
    out = torch.zeros(n, hq, q.shape[-1], dtype=torch.float64)
    for i in range(n):
        q_pos = prefix + int(depths[i])
        for h in range(hq):
            kh = h // (hq // k.shape[1])
            logits, values = [], []
            for j in range(k.shape[0]):
                if j < prefix:
                    k_pos, seen = j, True
                else:
                    k_pos, seen = prefix + int(depths[j - prefix]), bool(mask[i, j - prefix])
                dist = q_pos - k_pos
                if not seen or dist < 0 or (window is not None and dist >= window):
                    continue
                s = float((q[i, h].double() * k[j, kh].double()).sum()) * scale
                if rel is not None and dist < rel.shape[-1]:
                    s += float(rel[i, h, dist])
                logits.append(s)
                values.append(v[j, kh].double())
            m = max(logits)
            w = [math.exp(s - m) for s in logits]
            out[i, h] = sum(wi * vi for wi, vi in zip(w, values)) / sum(w)
    return out


@dataclass
class Batch:
    pool: InklingKVPool
    indptr: torch.Tensor  # the rails: each request's prefix slots, then its drafts' slots
    slots: torch.Tensor
    qo: torch.Tensor
    q: torch.Tensor
    rel: torch.Tensor
    trees: list = field(default_factory=list)  # (mask, depths) per request

    @property
    def kv(self) -> PagedKV:
        return self.pool.paged_kv(0)

    def verify(self, trees=None) -> SpecVerify:
        trees = self.trees if trees is None else trees
        return spec_verify([m for m, _ in trees], [d for _, d in trees])


def batch(kv_format: str, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    page = 128 if kv_format == "mxfp8" else 16
    plan = LayerPlan.from_windows({0: None}, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D)
    pool = InklingKVPool(plan, size=256, page_size=page, kv_format=kv_format)
    lens = [p + n for p, n in zip(PREFIX, DRAFTS)]
    slots = torch.randperm(255, generator=g)[: sum(lens)] + 1  # scattered, never slot 0
    pool.set_kv_buffer(0, slots, torch.randn(sum(lens), HKV, D, generator=g) * 2,
                       torch.randn(sum(lens), HKV, D, generator=g))
    rows = sum(DRAFTS)
    return Batch(pool, torch.tensor([0] + lens).cumsum(0), slots, torch.tensor([0] + DRAFTS).cumsum(0),
                 torch.randn(rows, HQ, D, generator=g) * 4, torch.randn(rows, HQ, REL_EXTENT, generator=g),
                 [tree_of(random_parents(n, g)) for n in DRAFTS])


def check_against_oracle(b: Batch, out: torch.Tensor, trees, window) -> None:
    for r, (mask, depths) in enumerate(trees):
        k, v = b.pool.read_kv(0, b.slots[b.indptr[r]:b.indptr[r + 1]])
        rows = slice(int(b.qo[r]), int(b.qo[r + 1]))
        want = dense_float64(b.q[rows], k, v, PREFIX[r], mask, depths, 1 / D, window, b.rel[rows])
        assert (out[rows].double() - want).abs().max() < 2e-6, f"request {r}"


@pytest.mark.parametrize("kv_format", ["bf16", "mxfp8"])
@pytest.mark.parametrize("window", [None, 4])
def test_random_trees_against_dense_float64(kv_format, window):
    b = batch(kv_format, seed=1 if window else 0)
    params = AttentionParams(softmax_scale=1 / D, window=window, rel_bias=b.rel)  # Inkling mode
    out = paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params, verify=b.verify())
    check_against_oracle(b, out, b.trees, window)
    # the torch route (one gather of the rails, then the reference) gives the same numbers
    routed = TorchRoute().extend(b.q, b.kv, KVRails(b.indptr, b.slots), b.qo, params, verify=b.verify())
    torch.testing.assert_close(routed, out, rtol=0, atol=0)


def test_a_window_rail_that_starts_late_gives_the_same_result():
    """SGLang's windowed layers read window rails (``window_start`` with the drafts as the queries): the root's
    window, a superset of every draft's."""
    b, window = batch("bf16", seed=2), 3
    params = AttentionParams(softmax_scale=1 / D, window=window, rel_bias=b.rel)
    full = paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params, verify=b.verify())
    lens = b.indptr.diff()
    start = window_start(lens, b.qo.diff(), window)
    assert int(start.min()) > 0  # the rails do start late
    idx = torch.cat([b.slots[int(b.indptr[r] + start[r]):int(b.indptr[r + 1])] for r in range(len(DRAFTS))])
    late = paged_extend_attention(b.q, b.kv, torch.tensor([0] + (lens - start).tolist()).cumsum(0), idx, b.qo,
                                  params, verify=b.verify())
    torch.testing.assert_close(late, full, rtol=0, atol=1e-6)


@pytest.mark.parametrize("window", [None, 4])
def test_a_chain_is_a_plain_extend_bit_for_bit(window):
    b = batch("mxfp8", seed=3)
    params = AttentionParams(softmax_scale=1 / D, window=window, rel_bias=b.rel)
    plain = paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params)
    chains = b.verify([chain(n) for n in DRAFTS])
    assert torch.equal(paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params, verify=chains), plain)
    rails = KVRails(b.indptr, b.slots)
    assert torch.equal(TorchRoute().extend(b.q, b.kv, rails, b.qo, params, verify=chains),
                       TorchRoute().extend(b.q, b.kv, rails, b.qo, params))


def test_the_mask_matters():
    """On a branching tree, letting each draft see every shallower draft (a valid mask: positions still increase)
    moves the rows whose visible drafts change, by far more than rounding; the oracle agrees with both masks. A mask
    of all True (drafts seeing their siblings and descendants) is refused."""
    b = batch("bf16", seed=4)
    params = AttentionParams(softmax_scale=1 / D, rel_bias=b.rel)
    tree = paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params, verify=b.verify())
    shallower = [((d.view(1, -1) < d.view(-1, 1)) | torch.eye(len(d), dtype=torch.bool), d) for _, d in b.trees]
    flat = paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params, verify=b.verify(shallower))
    check_against_oracle(b, flat, shallower, None)
    changed = torch.cat([(m != s).any(dim=1) for (m, _), (s, _) in zip(b.trees, shallower)])
    assert changed.any() and not changed.all()
    assert (flat[changed] - tree[changed]).abs().amax(dim=(1, 2)).min() > 1e-3
    torch.testing.assert_close(flat[~changed], tree[~changed], rtol=0, atol=0)
    everything = [(torch.ones_like(m), d) for m, d in b.trees]
    with pytest.raises(ValueError, match="must be strictly shallower"):
        b.verify(everything)


SPEC = LayerSpec(window=None, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, softmax_scale=1 / D)


@dataclass
class Keys:
    """One decode (request 0's prefix, its last key as the query's own) then the verify step's requests."""
    b: Batch
    num_decode_rows: int = 1
    max_seq_len: int = 32
    plans: DecodePlanCache = field(default_factory=DecodePlanCache)

    def decode_keys(self, window, reads_page_tables):
        return KVRails(torch.tensor([0, PREFIX[0]]), self.b.slots[:PREFIX[0]])

    def extend_keys(self, window):
        return KVRails(self.b.indptr, self.b.slots), self.b.qo


def test_layer_step_passes_verify_to_the_extend_rows():
    b = batch("mxfp8", seed=5)
    g = torch.Generator().manual_seed(6)
    q = torch.cat([torch.randn(1, HQ, D, generator=g), b.q])
    params_of = lambda first, last: AttentionParams(softmax_scale=1 / D, rel_bias=torch.cat(  # noqa: E731
        [torch.zeros(1, HQ, REL_EXTENT), b.rel])[first:last])
    # the forward's K/V: one row per query row, the drafts' rows unlike the pool's (so reading them matters)
    forward_kv = (torch.randn(q.shape[0], HKV, D, generator=g).bfloat16(),
                  torch.randn(q.shape[0], HKV, D, generator=g).bfloat16())
    out = layer_step.attend(TorchRoute(), SPEC, q, b.kv, Keys(b), params_of, None, forward_kv=forward_kv,
                            verify=b.verify())
    k, v = b.pool.read_kv(0, b.slots)
    draft = torch.cat([torch.arange(int(b.indptr[r + 1]) - DRAFTS[r], int(b.indptr[r + 1])) for r in range(3)])
    k[draft], v[draft] = forward_kv[0][1:].float(), forward_kv[1][1:].float()
    want = paged_extend_attention(b.q, PagedKV(k, v), b.indptr, torch.arange(k.shape[0]), b.qo,
                                  params_of(1, q.shape[0]), verify=b.verify())
    torch.testing.assert_close(out[1:], want, rtol=0, atol=1e-6)
    plain = layer_step.attend(TorchRoute(), SPEC, q, b.kv, Keys(b), params_of, None, forward_kv=forward_kv)
    torch.testing.assert_close(out[:1], plain[:1], rtol=0, atol=0)  # the decode row is untouched by verify
    assert (out[1:] - plain[1:]).abs().max() > 1e-3


def test_a_route_without_tree_masks_refuses_a_verify_step_before_any_write():
    b = batch("bf16", seed=7)
    plain = SimpleNamespace(name="stand-in", serves_verify=False, reads_page_tables=False)  # no kernel is reached
    q = torch.cat([torch.randn(1, HQ, D), b.q])
    out = torch.zeros_like(q)
    with pytest.raises(NotImplementedError, match="the stand-in route cannot serve a speculative verify step"):
        layer_step.attend(plain, SPEC, q, b.kv, Keys(b), lambda f, t: AttentionParams(1 / D), None, out,
                          verify=b.verify())
    # the same refusal is a ValueError too (the rule for every refusal here); hosts may catch either type
    with pytest.raises(ValueError, match="the stand-in route cannot serve a speculative verify step") as refused:
        layer_step.attend(plain, SPEC, q, b.kv, Keys(b), lambda f, t: AttentionParams(1 / D), None, out,
                          verify=b.verify())
    assert type(refused.value) is UnsupportedFeature
    assert not out.any()  # nothing written
    with pytest.raises(ValueError, match="the step has no extend rows"):
        layer_step.attend(TorchRoute(), SPEC, q[:1], b.kv, Keys(b), lambda f, t: AttentionParams(1 / D), None,
                          out[:1], verify=b.verify())
    wrong = spec_verify([chain(n)[0] for n in (7, 5, 5)], [chain(n)[1] for n in (7, 5, 5)])
    with pytest.raises(ValueError, match=r"request 2 has 5 draft tokens \(mask_indptr\) but 6 query rows"):
        layer_step.attend(TorchRoute(), SPEC, q, b.kv, Keys(b), lambda f, t: AttentionParams(1 / D), None, out,
                          verify=wrong)
    assert not out.any()


def with_entry(mask: torch.Tensor, i: int, j: int, value: bool) -> torch.Tensor:
    """``mask`` flattened, with ``mask[i, j] = value``."""
    mask = mask.clone()
    mask[i, j] = value
    return mask.reshape(-1)


def test_bad_inputs_are_refused_naming_the_argument():
    m, d = tree_of([-1, 0, 0, 1])
    flat, ptr = m.reshape(-1), torch.tensor([0, 16])
    SpecVerify(flat, ptr, d)  # the good one, in either index dtype
    assert SpecVerify(flat, ptr.int(), d.int()).request(0)[1].dtype == torch.int64
    cases = [
        (TypeError, "tree_mask must be a bool tensor", (flat.int(), ptr, d)),
        (ValueError, "tree_mask must be 1-D", (m, ptr, d)),
        (TypeError, "mask_indptr must be an int32/int64 tensor", (flat, ptr.float(), d)),
        (ValueError, "mask_indptr must be 1-D with batch", (flat, torch.tensor([0]), d)),
        (ValueError, "mask_indptr must start at 0, be non-decreasing and end at tree_mask's 16",
         (flat, torch.tensor([0, 15]), d)),
        (ValueError, "mask_indptr must start at 0", (torch.cat([flat, flat]), torch.tensor([0, 20, 16, 32]), d)),
        (ValueError, "request 1's mask has 8 entries, not a square",
         (torch.ones(24, dtype=torch.bool), torch.tensor([0, 16, 24]), d)),
        (TypeError, "depths must be an int32/int64 tensor", (flat, ptr, d.float())),
        (TypeError, "depths must be an int32/int64 tensor", (flat, ptr, d.bool())),
        (ValueError, r"depths must be 1-D with one entry per draft token, 4", (flat, ptr, d[:3])),
        (ValueError, "depths must be >= 0, got -1", (flat, ptr, d - 1)),
        (ValueError, "request 0's draft 2 does not see itself", (with_entry(m, 2, 2, False), ptr, d)),
        (ValueError, r"draft 2 \(depth 1\) sees draft 1 \(depth 1\)", (with_entry(m, 2, 1, True), ptr, d)),
        (ValueError, r"draft 1 \(depth 1\) sees draft 3 \(depth 2\)", (with_entry(m, 1, 3, True), ptr, d)),
        (ValueError, r"draft 3 \(depth 1\) sees draft 1 \(depth 1\)", (flat, ptr, torch.tensor([0, 1, 1, 1]))),
    ]
    for error, message, args in cases:
        with pytest.raises(error, match=message):
            SpecVerify(*args)
    b = batch("bf16", seed=8)
    params = AttentionParams(1 / D)
    with pytest.raises(TypeError, match="verify must be None or a SpecVerify, got tuple"):
        paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params, verify=(flat, ptr, d))
    with pytest.raises(ValueError, match=r"verify has 1 requests \(mask_indptr\), the extend 3"):
        paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params, verify=SpecVerify(flat, ptr, d))
    with pytest.raises(ValueError, match=r"request 0 has 4 draft tokens \(mask_indptr\) but 7 query rows"):
        paged_extend_attention(b.q, b.kv, b.indptr, b.slots, b.qo, params,
                               verify=spec_verify([m, m, m], [d, d, d]))
    with pytest.raises(TypeError, match="verify must be None or a SpecVerify"):
        layer_step.attend(TorchRoute(), SPEC, b.q, b.kv, Keys(b, num_decode_rows=0), lambda f, t: params, None,
                          verify="tree")


def test_a_uniform_verify_reads_nothing_and_checks_shapes_only():
    """``SpecVerify.uniform`` (a CUDA graph's verify buffers): built from its shapes without reading a value (a tree
    the checked constructor refuses is taken: a refill writes them later), every request ``D`` drafts; its query
    check compares the request count only. Wrong dtypes, shapes and devices are refused, naming the tensor."""
    d, b = 3, 2
    bad_tree = torch.zeros(b * d * d, dtype=torch.bool)  # no diagonal: SpecVerify itself refuses it
    ptr, depths = torch.arange(b + 1) * d * d, torch.zeros(b * d, dtype=torch.int64)
    with pytest.raises(ValueError, match="does not see itself"):
        SpecVerify(bad_tree, ptr, depths)
    v = SpecVerify.uniform(bad_tree, ptr, depths, d, b)
    assert v.uniform_len == d and v.draft_lens == (d, d) and v.tree_mask is bad_tree
    assert SpecVerify(*chain_tree_batch(d, b)).uniform_len == 0
    v.check_queries(torch.arange(b + 1) * d)
    with pytest.raises(ValueError, match=r"verify has 2 requests; qo_indptr must have 3 entries"):
        v.check_queries(torch.arange(b + 2) * d)
    cases = [
        (TypeError, "tree_mask must be a torch.bool tensor", (bad_tree.to(torch.uint8), ptr, depths, d, b)),
        (ValueError, r"tree_mask must be 1-D with 18 entries \(2 requests of 3 drafts\)",
         (bad_tree[:-1], ptr, depths, d, b)),
        (TypeError, "mask_indptr must be a torch.int64 tensor", (bad_tree, ptr.int(), depths, d, b)),
        (ValueError, "mask_indptr must be 1-D with 3 entries", (bad_tree, ptr[:2], depths, d, b)),
        (ValueError, "depths must be 1-D with 6 entries", (bad_tree, ptr, depths.view(2, 3), d, b)),
        (ValueError, "draft_len must be", (bad_tree, ptr, depths, 0, b)),
        (ValueError, "batch must be", (bad_tree, ptr, depths, d, 0)),
        # a tensor on the meta device holds no data: refused by name (checks.require_tensor) before the device check
        (ValueError, r"depths must be a torch.int64 tensor holding data, got a tensor on the meta device",
         (bad_tree, ptr, depths.to("meta"), d, b)),
    ]
    for error, message, args in cases:
        with pytest.raises(error, match=message):
            SpecVerify.uniform(*args)


def chain_tree_batch(d, b):
    mask, depths = chain(d)
    return mask.reshape(-1).repeat(b), torch.arange(b + 1) * d * d, depths.repeat(b)

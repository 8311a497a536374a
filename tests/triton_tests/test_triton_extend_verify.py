"""The Triton extend kernel on a speculative verify step (``verify``: one draft tree per request) against the
reference (``reference.attention.paged_extend_attention(..., verify=)``, itself checked against plain float64 loops
in ``tests/test_spec_verify.py``): bf16 and MXFP8 pools, GQA 2, random branching trees, with a window, Inkling's
relative bias, a soft cap and sinks; a chain equals the plain extend; the mask and the depths each matter (the same
call with every draft visible, or with positions by row instead of depth, differs by far more than the tolerance);
the route runs it past the FlashInfer family; bad input is refused."""

import os
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton's jit

pytest.importorskip("triton")

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend import triton as kernels  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV, SpecVerify  # noqa: E402
from sglang_inkling_backend.rails import KVRails  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_extend_attention as reference_extend  # noqa: E402
from sglang_inkling_backend.reference.draft_trees import chain_tree, random_tree  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402
from sglang_inkling_backend.step_plans import DecodePlanCache  # noqa: E402
from sglang_inkling_backend.gpu.route import GpuRoute  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
SLOTS, HQ, HKV, D = 256, 4, 2, 64
PREFIX, DRAFTS = (9, 0, 40), (7, 5, 6)
# float32 output over bf16-exact inputs; the kernel dots in bf16 (p rounded to bf16 for p.V): 2**-8 relative
TOL = 1e-2


def spec_verify(trees):
    return SpecVerify.from_trees(trees, DEV)


def make_case(fmt, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(SLOTS, HKV, D, generator=g)
    v = torch.randn(SLOTS, HKV, D, generator=g)
    if fmt == "mxfp8":
        layout = ScaleLayout.for_pool(SLOTS, HKV, D, 128)
        (kd, ks), (vd, vs) = mxfp8.quantize(k.bfloat16()), mxfp8.quantize(v.bfloat16())
        k_scales, v_scales = layout.empty("cpu"), layout.empty("cpu")
        layout.scatter(k_scales, torch.arange(SLOTS), ks)
        layout.scatter(v_scales, torch.arange(SLOTS), vs)
        kv = PagedKV(kd.to(DEV), vd.to(DEV), k_scales.to(DEV), v_scales.to(DEV), layout)
    else:
        kv = PagedKV(k.bfloat16().to(DEV), v.bfloat16().to(DEV))
    lens = [p + n for p, n in zip(PREFIX, DRAFTS)]
    rails = KVRails(torch.tensor([0, *lens]).cumsum(0).to(DEV), torch.randperm(SLOTS, generator=g)[:sum(lens)].to(DEV))
    qo = torch.tensor([0, *DRAFTS]).cumsum(0).to(DEV)
    q = torch.randn(sum(DRAFTS), HQ, D, generator=g).bfloat16().to(DEV)
    return g, kv, rails, qo, q, spec_verify([random_tree(n, g) for n in DRAFTS])


def rel_err(got, want):
    return float((got.float() - want.float()).norm() / want.float().norm())


def triton_verify(q, kv, rails, qo, params, verify):
    return kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo, params, out=torch.empty(
        q.shape, dtype=torch.float32, device=q.device), block_rows=16, block_n=16, verify=verify)


@pytest.mark.parametrize("fmt", ["bf16", "mxfp8"])
@pytest.mark.parametrize("variant", ["plain", "window", "inkling", "cap_sinks"])
def test_verify_matches_the_reference(fmt, variant):
    g, kv, rails, qo, q, verify = make_case(fmt, seed=11)
    rows = q.shape[0]
    params = {
        "plain": AttentionParams(D ** -0.5),
        "window": AttentionParams(D ** -0.5, window=6),
        "inkling": AttentionParams(1.0 / D, rel_bias=torch.randn(rows, HQ, 8, generator=g).to(DEV)),
        "cap_sinks": AttentionParams(D ** -0.5, logit_cap=4.0, sinks=torch.randn(HQ, generator=g).to(DEV)),
    }[variant]
    got = triton_verify(q, kv, rails, qo, params, verify)
    want = reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params, verify=verify)
    assert rel_err(got, want) < TOL
    # The tolerance tells the tree apart: another tree of the same sizes differs by more, and where positions matter
    # (a window, the relative bias) so do positions by row instead of depth.
    others = [spec_verify([random_tree(n, torch.Generator().manual_seed(99 + n)) for n in DRAFTS])]
    if variant in ("window", "inkling"):
        others.append(SpecVerify(verify.tree_mask, verify.mask_indptr,
                                 torch.cat([torch.arange(n) for n in DRAFTS]).to(DEV)))
    for other in others:
        wrong = reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params, verify=other)
        assert rel_err(got, wrong) > 3 * TOL


def test_a_chain_is_the_plain_extend():
    g, kv, rails, qo, q, _ = make_case("mxfp8", seed=13)
    params = AttentionParams(D ** -0.5, window=5)
    chain = spec_verify([chain_tree(n) for n in DRAFTS])
    got = triton_verify(q, kv, rails, qo, params, chain)
    plain = kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo, params, out=torch.empty(
        q.shape, dtype=torch.float32, device=q.device), block_rows=16, block_n=16)
    torch.testing.assert_close(got, plain, rtol=0, atol=1e-6)


def test_the_route_runs_the_kernel_past_the_flashinfer_family():
    """A verify step through GpuRoute.extend with the FlashInfer family present: the family (no tree mask) is not
    asked; the Triton kernel's result matches the reference."""
    class NoRaggedPrefill:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the FlashInfer family must not serve a verify step")

    from sglang_inkling_backend.flashinfer.extend import FlashInferExtend
    fake = types.SimpleNamespace(__version__="0.7.2", BatchPrefillWithRaggedKVCacheWrapper=NoRaggedPrefill)
    route = GpuRoute(kernels, FlashInferExtend(fake, torch.device(DEV), torch.empty(16, dtype=torch.uint8)))
    assert route.serves_verify
    g, kv, rails, qo, q, verify = make_case("bf16", seed=14)
    params = AttentionParams(D ** -0.5)
    got = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache(), verify=verify)
    want = reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params, verify=verify)
    assert rel_err(got, want) < TOL


def test_bad_verify_input_is_refused():
    g, kv, rails, qo, q, verify = make_case("bf16", seed=15)
    params = AttentionParams(D ** -0.5)
    with pytest.raises(TypeError, match="verify must be None or a SpecVerify"):
        kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo, params, verify="tree")
    short = spec_verify([random_tree(n, g) for n in (7, 5, 5)])
    with pytest.raises(ValueError, match=r"request 2 has 5 draft tokens \(mask_indptr\) but 6 query rows"):
        kernels.paged_extend_attention(q, kv, rails.indptr, rails.indices, qo, params, verify=short)
    table = torch.zeros(3, 4, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="reads per-token CSR keys"):
        kernels.paged_extend_attention(q, kv, qo_indptr=qo, params=params, page_table=table,
                                       seq_lens=rails.indptr.diff(), page_size=16, verify=verify)


def test_the_gpu_check_script_runs_in_smoke_mode():
    """gpu_tests/check_verify_gpu.py (the H200 check of this kernel at serving shapes) at tiny shapes here, so the
    device call does not find a script error."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "gpu_tests" / "check_verify_gpu.py"
    done = subprocess.run([sys.executable, str(script), "--smoke"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and '"failed": []' in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.parametrize("fmt,draft,params_of", [
    ("bf16", 6, lambda g, rows: AttentionParams(D ** -0.5, window=7)),
    ("mxfp8", 11, lambda g, rows: AttentionParams(1.0 / D, rel_bias=torch.randn(rows, HQ, 8, generator=g).to(DEV))),
])
def test_the_static_grid_verify_equals_the_eager_launch(fmt, draft, params_of):
    """uniform_verify_attention (a verify batch of equal draft counts, laid out from its shapes so a CUDA graph can
    capture it) gives the eager launch's bytes, 1 and 2 blocks of rows per request (BLOCK_M 8), and the reference's
    values; a tree of another request's shape in its place gives other values."""
    g = torch.Generator().manual_seed(21)
    _, kv, _, _, _, _ = make_case(fmt, seed=21)
    lens = [p + draft for p in PREFIX]
    rails = KVRails(torch.tensor([0, *lens]).cumsum(0).to(DEV),
                    torch.randperm(SLOTS, generator=g)[:sum(lens)].to(DEV))
    qo = (torch.arange(len(PREFIX) + 1) * draft).to(DEV)
    q = torch.randn(len(PREFIX) * draft, HQ, D, generator=g).bfloat16().to(DEV)
    trees = [random_tree(draft, g) for _ in PREFIX]
    verify = spec_verify(trees)
    verify = SpecVerify(verify.tree_mask.to(DEV), verify.mask_indptr.to(DEV, torch.int64),
                        verify.depths.to(DEV, torch.int64))
    params = params_of(g, q.shape[0])
    out = lambda: torch.empty(q.shape, dtype=torch.float32, device=q.device)  # noqa: E731
    got = kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, draft, out=out(),
                                           block_rows=16, block_n=16)
    assert torch.equal(got, triton_verify(q, kv, rails, qo, params, verify))
    want = reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params, verify=verify)
    assert rel_err(got, want) < TOL
    swapped = spec_verify([trees[1], trees[0], trees[2]])
    wrong = kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, SpecVerify(
        swapped.tree_mask.to(DEV), swapped.mask_indptr.to(DEV, torch.int64), swapped.depths.to(DEV, torch.int64)),
        draft, out=out(), block_rows=16, block_n=16)
    assert rel_err(wrong, want) > 3 * TOL


def test_the_static_grid_verify_refuses_what_it_cannot_lay_out():
    g, kv, rails, qo, q, verify = make_case("bf16", seed=22)  # draft counts 7, 5, 6: not uniform
    params = AttentionParams(D ** -0.5)
    with pytest.raises(ValueError, match=r"q must have batch \* draft_len = 3 \* 5 rows, got 18"):
        kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, 5)
    with pytest.raises(ValueError, match="draft_len must be an int >= 1, got 0"):
        kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, 0)


def test_the_route_lays_out_a_uniform_verify_from_its_shapes(monkeypatch):
    """GpuRoute.extend with a ``SpecVerify.uniform`` (a verify graph's metadata) runs the static-grid launch, never
    the eager one (whose layout reads the device), with the eager launch's bytes on the same batch."""
    g = torch.Generator().manual_seed(23)
    draft = 4
    _, kv, _, _, _, _ = make_case("mxfp8", seed=23)
    lens = [p + draft for p in PREFIX]
    rails = KVRails(torch.tensor([0, *lens]).cumsum(0).to(DEV), torch.randperm(SLOTS, generator=g)[:sum(lens)].to(DEV))
    qo = (torch.arange(len(PREFIX) + 1) * draft).to(DEV)
    q = torch.randn(len(PREFIX) * draft, HQ, D, generator=g).bfloat16().to(DEV)
    checked = spec_verify([random_tree(draft, g) for _ in PREFIX])
    parts = (checked.tree_mask.to(DEV), checked.mask_indptr.to(DEV, torch.int64), checked.depths.to(DEV, torch.int64))
    params = AttentionParams(D ** -0.5, window=9)
    route = GpuRoute(kernels)
    eager = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache(), verify=SpecVerify(*parts))

    def no_eager_layout(*args, **kwargs):
        raise AssertionError("a uniform verify must not take the eager launch")

    monkeypatch.setattr(kernels, "paged_extend_attention", no_eager_layout)
    got = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache(),
                       verify=SpecVerify.uniform(*parts, draft, len(PREFIX)))
    assert torch.equal(got, eager)


def uniform_case(fmt, draft, seed):
    """A verify batch of ``draft`` drafts per request over PREFIX (9, 0, 40) cached keys, int64 trees on DEV."""
    g = torch.Generator().manual_seed(seed)
    _, kv, _, _, _, _ = make_case(fmt, seed=seed)
    lens = [p + draft for p in PREFIX]
    rails = KVRails(torch.tensor([0, *lens]).cumsum(0).to(DEV),
                    torch.randperm(SLOTS, generator=g)[:sum(lens)].to(DEV))
    qo = (torch.arange(len(PREFIX) + 1) * draft).to(DEV)
    q = torch.randn(len(PREFIX) * draft, HQ, D, generator=g).bfloat16().to(DEV)
    verify = spec_verify([random_tree(draft, g) for _ in PREFIX])
    verify = SpecVerify(verify.tree_mask.to(DEV), verify.mask_indptr.to(DEV, torch.int64),
                        verify.depths.to(DEV, torch.int64))
    return g, kv, rails, qo, q, verify


@pytest.mark.parametrize("fmt,params_of", [
    ("bf16", lambda g, rows: AttentionParams(D ** -0.5, logit_cap=4.0, sinks=torch.randn(HQ, generator=g).to(DEV))),
    ("mxfp8", lambda g, rows: AttentionParams(1.0 / D, window=20,
                                              rel_bias=torch.randn(rows, HQ, 8, generator=g).to(DEV))),
])
def test_a_verify_split_over_its_keys_gives_the_reference(fmt, params_of, monkeypatch):
    """num_splits 4 and 8 with 16-key splits: the third request's 51 keys (40 cached, 11 drafts) spread over 4 splits,
    the first's 20 over 2, the second's 11 drafts over 1 (the rest empty): the merged output is within the kernel's
    tolerance of the reference and of the unsplit launch; sinks count once (in the merge), the window and the relative
    bias per split. A merge that ignores the splits' log-sum-exps (every weight equal) misses the reference by far
    more than the tolerance."""
    from sglang_inkling_backend.triton import extend_attention

    draft = 11
    g, kv, rails, qo, q, verify = uniform_case(fmt, draft, seed=31)
    params = params_of(g, q.shape[0])
    want = reference_extend(q.float(), kv, rails.indptr, rails.indices, qo, params, verify=verify)

    def run(splits):
        out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        return kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, draft,
                                                out=out, block_rows=16, block_n=16, num_splits=splits,
                                                split_min_keys=16)

    whole = run(1)
    assert rel_err(whole, want) < TOL
    for splits in (4, 8):
        got = run(splits)
        assert rel_err(got, want) < TOL and rel_err(got, whole) < TOL, splits
    merge = extend_attention.verify_merge_kernel

    class EqualWeights:  # the merge launched on log-sum-exps all zeroed
        def __getitem__(self, grid):
            def launch(part_o, part_lse, *args, **kwargs):
                part_lse.zero_()
                return merge[grid](part_o, part_lse, *args, **kwargs)
            return launch

    monkeypatch.setattr(extend_attention, "verify_merge_kernel", EqualWeights())
    assert rel_err(run(4), want) > 3 * TOL


def test_the_verify_split_count_fills_the_sms_and_bad_counts_are_refused():
    from sglang_inkling_backend.triton.plan import choose_verify_splits

    # one request of 12 drafts over 2 KV heads (2 row programs) up to 64 programs' worth, 1 once rows fill 132 SMs
    assert [choose_verify_splits(p, 132) for p in (1, 2, 8, 64, 100, 131, 132, 1000)] == [32, 32, 32, 4, 2, 2, 1, 1]
    with pytest.raises(ValueError, match="programs must be a positive int, got 0"):
        choose_verify_splits(0, 132)
    g, kv, rails, qo, q, verify = uniform_case("bf16", 4, seed=32)
    params = AttentionParams(D ** -0.5)
    for bad, message in ((3, "num_splits must be a power of two in"), (64, "num_splits must be a power of two in")):
        with pytest.raises(ValueError, match=message):
            kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, 4,
                                             num_splits=bad)
    with pytest.raises(ValueError, match="split_min_keys must be a positive int, got 0"):
        kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, 4, num_splits=2,
                                         split_min_keys=0)


def test_a_split_verify_keeps_its_partials_in_the_callers_workspace():
    """With a ``DecodeWorkspace``, a split verify launch writes its partials there (every one of them: stale values
    that would dominate the merge are all overwritten) and gives the bytes of the launch that allocates its own; a
    workspace too small for them, or not a workspace, is refused by name before anything is written."""
    draft, splits = 11, 4
    g, kv, rails, qo, q, verify = uniform_case("mxfp8", draft, seed=33)
    params = AttentionParams(1.0 / D, window=20, rel_bias=torch.randn(q.shape[0], HQ, 8, generator=g).to(DEV))
    rows = q.shape[0]

    def run(**kwargs):
        out = torch.full(q.shape, 7.0, dtype=torch.float32, device=q.device)
        return kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, draft,
                                                out=out, block_rows=16, block_n=16, num_splits=splits,
                                                split_min_keys=16, **kwargs)

    own = run()
    workspace = kernels.DecodeWorkspace(rows, HQ, D, splits, DEV)
    workspace.part_o.fill_(1e3)
    workspace.part_lse.fill_(1e4)  # a stale log-sum-exp would take all of the merge's weight
    assert torch.equal(run(workspace=workspace), own)
    assert not bool((workspace.part_lse == 1e4).any())  # all rows x Hq x splits written, none left stale
    small = kernels.DecodeWorkspace(rows, HQ, D, splits // 2, DEV)
    out = torch.full(q.shape, 7.0, dtype=torch.float32, device=q.device)
    with pytest.raises(ValueError, match="workspace too small for a verify launch's partials: 33 rows x Hq=4 x 4 "
                                         "splits x head_dim=64"):
        kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, verify, draft, out=out,
                                         block_rows=16, block_n=16, num_splits=splits, workspace=small)
    assert bool((out == 7.0).all())
    with pytest.raises(TypeError, match="workspace must be a DecodeWorkspace or None, got str"):
        run(workspace="scratch")


@pytest.mark.parametrize("hq,hkv,draft", [(4, 2, 4), (16, 1, 12), (64, 4, 8)])
def test_the_verify_workspace_shape_holds_every_batchs_partials(hq, hkv, draft):
    """``verify_workspace_shape``: a workspace of its ``(rows, splits)`` holds the partials of every batch of up to 64
    requests (on the interpreter's 16 planned SMs), and one of half that size does not hold them all."""
    rows, splits = kernels.verify_workspace_shape(64, draft, hq, hkv, "cpu")
    workspace = kernels.DecodeWorkspace(rows, hq, 16, splits, "cpu")
    half = kernels.DecodeWorkspace(rows, hq, 8, splits, "cpu")  # half the values per row
    needs = [(b * draft, kernels.verify_splits(b, draft, hq, hkv, "cpu")) for b in range(1, 65)]
    assert all(workspace.holds(r, hq, s, 16) for r, s in needs if s > 1)
    assert not all(half.holds(r, hq, s, 16) for r, s in needs if s > 1)
    assert max(r * s for r, s in needs if s > 1) == rows * splits
    with pytest.raises(ValueError, match="max_batch must be a positive int, got 0"):
        kernels.verify_workspace_shape(0, draft, hq, hkv, "cpu")


def test_the_route_gives_a_uniform_verify_the_workspace_it_made(caplog):
    """``GpuRoute.make_workspace(verify_draft_len=D)`` sizes the workspace for D-draft verify launches, and
    ``extend`` hands it to them (the partials land there: the stale sentinel is gone), with the bytes of a launch
    that allocates its own; a workspace sized without verify is too small here: the launch allocates its own, with
    one INFO line for the shape, not one per call."""
    import logging

    draft = 12
    g, kv, rails, qo, q, verify = uniform_case("bf16", draft, seed=34)
    uniform = SpecVerify.uniform(verify.tree_mask, verify.mask_indptr, verify.depths, draft, len(PREFIX))
    params = AttentionParams(D ** -0.5, logit_cap=4.0, sinks=torch.randn(HQ, generator=g).to(DEV))
    route = GpuRoute(kernels)
    splits = kernels.verify_splits(len(PREFIX), draft, HQ, HKV, DEV)
    assert splits > 1  # 3 requests x 2 KV heads: 6 row programs of 16 planned SMs
    sized = route.make_workspace(max_batch=8, geometries={(HQ, HKV, D)}, max_seq_len=64, device=DEV,
                                 verify_draft_len=draft)
    decode_only = route.make_workspace(max_batch=1, geometries={(HQ, HKV, D)}, max_seq_len=16, device=DEV)
    assert sized.holds(q.shape[0], HQ, splits, D) and not decode_only.holds(q.shape[0], HQ, splits, D)
    sized.part_lse.fill_(1e4)
    own = kernels.uniform_verify_attention(q, kv, rails.indptr, rails.indices, qo, params, uniform, draft)
    got = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache(), verify=uniform, workspace=sized)
    assert torch.equal(got, own)
    assert not bool((sized.part_lse[:q.shape[0] * HQ * splits] == 1e4).any())
    with caplog.at_level(logging.INFO, logger="sglang_inkling_backend.gpu.route"):
        for _ in range(2):
            got = route.extend(q, kv, rails, qo, params, plans=DecodePlanCache(), verify=uniform,
                               workspace=decode_only)
            assert torch.equal(got, own)
    lines = [r.getMessage() for r in caplog.records if "allocated per launch" in r.getMessage()]
    assert len(lines) == 1 and f"36 rows x 4 heads x {splits} splits x head_dim 64" in lines[0], lines

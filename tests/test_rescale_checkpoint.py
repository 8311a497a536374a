"""integration/rescale_checkpoint.py preserves the model's function: the original and the rescaled SmolLM2-135M and
Gemma-3-270M checkpoints, in HF transformers (eager attention, CPU), give bit-identical logits in float32 and in
bfloat16, while the captured V is 2**A times the original and the K outlier channels 2**B times (Q's 2**-B).

Why bit-identical and not merely close: every scaled weight is w * 2**e stored exactly (the rescaler checks it), and
from there each floating-point operation of the forward pass either sees the same operands as before or operands
that are the originals times a power of two. Rounding commutes with a power-of-two factor (only the exponent moves)
as long as nothing overflows or goes subnormal, and sums are formed in the same order, so v = x @ Wv^T is exactly
2**A times the original (bf16 output rounding included), p @ V likewise, and o_proj's products (2**A a)(2**-A w) are
exactly a*w. For K: RoPE mixes channel c only with c +- d/2, which carries the same factor, and q.k's products
(2**-B q_c)(2**B k_c) are exactly q_c k_c. So equality is asserted exactly (torch.equal); the deliberately broken
rescales show that this check does see a wrong factor or a wrong GQA column mapping.
"""
import functools
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

# An optional part (transformers and safetensors are not in the test extra): skipped with a reason where absent.
pytest.importorskip("safetensors", reason="safetensors is not installed (the rescaler reads and writes checkpoints)")
if importlib.util.find_spec("transformers") is None:
    pytest.skip("transformers is not installed", allow_module_level=True)

from safetensors import safe_open  # noqa: E402

from demo.models import cache_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration"))
from rescale_checkpoint import _scaled, outlier_channels, rescale  # noqa: E402

SMOL, GEMMA = cache_dir() / "smollm2-135m-instruct", cache_dir() / "gemma-3-270m"
TOKENS = 64
V_LOG2, K_LOG2 = 7, 6  # SmolLM2: max |V| 13.7 -> 1752 (integration/kv_ranges.py); K outlier channels 7.4 -> 474
GEMMA_V_LOG2 = 3       # Gemma-3-270M: max |V| 146 -> 1168

try:  # the torchvision op-schema work-around (a CPU torch with the PyPI torchvision): before transformers imports it
    from sglang_inkling_backend.hosts.sglang.cpu_testing import prepare_sglang_cpu_import
    prepare_sglang_cpu_import()
except FileNotFoundError:
    pass


def _need(model_dir: Path) -> None:
    if not (model_dir / "model.safetensors").is_file():
        pytest.skip(f"{model_dir} is not prepared (demo.models prepares it)")


@functools.lru_cache(maxsize=None)
def _ids(model_dir: Path) -> torch.Tensor:
    from transformers import AutoTokenizer
    text = (ROOT / "integration" / "data" / "long_text.txt").read_text(encoding="utf-8")
    return AutoTokenizer.from_pretrained(model_dir)(text[:4000], return_tensors="pt").input_ids[:, :TOKENS]


def _load(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager").eval()


def _forward(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, list[torch.Tensor]]]:
    """Logits, and per layer the outputs of q_proj, k_proj and v_proj ([tokens, heads * d])."""
    caught: dict[str, list[torch.Tensor]] = {"q_proj": [], "k_proj": [], "v_proj": []}
    handles = []
    for layer in model.model.layers:
        for name in caught:
            handles.append(getattr(layer.self_attn, name).register_forward_hook(
                lambda mod, inp, out, name=name: caught[name].append(out.detach()[0].clone())))
    with torch.no_grad():
        logits = model(ids).logits[0]
    for handle in handles:
        handle.remove()
    return logits, caught


@functools.lru_cache(maxsize=None)
def _run(model_dir: Path, dtype: torch.dtype):
    return _forward(_load(model_dir, dtype), _ids(model_dir))


@pytest.fixture(scope="module")
def smol_rescaled(tmp_path_factory):
    _need(SMOL)
    dst = tmp_path_factory.mktemp("rescaled") / "smollm2-v7-k6"
    return dst, rescale(SMOL, dst, v_log2=V_LOG2, k_outlier_log2=K_LOG2)


@pytest.fixture(scope="module")
def smol_per_head_v(tmp_path_factory):
    """V of KV heads 0, 1, 2 times 2**3, 2**-2, 2**5: o_proj's column blocks must follow the GQA grouping."""
    _need(SMOL)
    dst = tmp_path_factory.mktemp("rescaled") / "smollm2-v-per-head"
    return dst, rescale(SMOL, dst, v_log2=[3, -2, 5])


def test_rescale_facts_and_files(smol_rescaled):
    dst, facts = smol_rescaled
    layers = facts["layers"]
    assert (facts["head_dim"], facts["num_attention_heads"], facts["num_key_value_heads"], layers) == (64, 9, 3, 30)
    assert facts["k_channels"] == outlier_channels(64) == [3, 35, 5, 37]
    assert (facts["v_factor"], facts["k_factor"], facts["q_factor"]) == (2.0 ** V_LOG2, 2.0 ** K_LOG2, 2.0 ** -K_LOG2)
    assert sorted(facts["tensors_changed"]) == sorted(f"model.layers.{i}.self_attn.{p}_proj.weight"
                                                      for i in range(layers) for p in "qkvo")
    assert json.loads((dst / "rescale.json").read_text())["tensors_changed"] == facts["tensors_changed"]
    assert (dst / "config.json").read_bytes() == (SMOL / "config.json").read_bytes()
    assert (dst / "tokenizer.json").is_file() and not (dst / "inkling_prepared.json").exists()
    with safe_open(SMOL / "model.safetensors", "pt") as a, safe_open(dst / "model.safetensors", "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        for name in a.keys():
            x, y = a.get_tensor(name), b.get_tensor(name)
            assert x.dtype == y.dtype == torch.bfloat16 and x.shape == y.shape
            if name not in facts["tensors_changed"]:
                assert torch.equal(x, y), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_smollm2_v_and_k_rescale_is_bit_identical(smol_rescaled, dtype):
    dst, facts = smol_rescaled
    logits0, caps0 = _run(SMOL, dtype)
    logits1, caps1 = _run(dst, dtype)
    assert torch.equal(logits0, logits1)
    d, channels = facts["head_dim"], facts["k_channels"]
    for layer, (v0, v1) in enumerate(zip(caps0["v_proj"], caps1["v_proj"])):
        assert torch.equal(v1, v0 * 2.0 ** V_LOG2), layer
    for which, factor in (("k_proj", 2.0 ** K_LOG2), ("q_proj", 2.0 ** -K_LOG2)):
        for layer, (x0, x1) in enumerate(zip(caps0[which], caps1[which])):
            x0, x1 = x0.view(TOKENS, -1, d), x1.view(TOKENS, -1, d)  # every head: the same channels
            expected = x0.clone()
            expected[:, :, channels] *= factor
            assert torch.equal(x1, expected), (which, layer)
            assert not torch.equal(x1, x0)


def test_smollm2_gqa_column_mapping_is_bit_identical(smol_per_head_v):
    dst, facts = smol_per_head_v
    assert facts["v_log2"] == [3, -2, 5]
    logits0, caps0 = _run(SMOL, torch.bfloat16)
    logits1, caps1 = _run(dst, torch.bfloat16)
    assert torch.equal(logits0, logits1)
    factors = torch.tensor([2.0 ** 3, 2.0 ** -2, 2.0 ** 5]).repeat_interleave(64)
    for v0, v1 in zip(caps0["v_proj"], caps1["v_proj"]):
        assert torch.equal(v1, v0 * factors.to(v0.dtype))


def _o_columns(model, log2_of_q_head):
    """Multiply every layer's o_proj column block of query head h by 2**log2_of_q_head(h)."""
    cfg = model.config
    d = cfg.head_dim
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.self_attn.o_proj.weight
            for h in range(cfg.num_attention_heads):
                w[:, h * d:(h + 1) * d] *= 2.0 ** log2_of_q_head(h)


def _wrong_o_factor(model):
    """o_proj of layer 0 scaled by 2**-(A - 1) instead of 2**-A."""
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight *= 2.0


def _q_not_scaled(model):
    """q_proj's outlier channels left unscaled (K's are 2**B: q.k grows by 2**B on those channels)."""
    d = model.config.head_dim
    rows = [h * d + c for h in range(model.config.num_attention_heads) for c in outlier_channels(d)]
    with torch.no_grad():
        model.model.layers[5].self_attn.q_proj.weight[rows] *= 2.0 ** K_LOG2


def _gqa_by_modulo(model):
    """The per-head V rescale with o_proj's blocks mapped to KV head h % n_kv instead of h // group: undo the right
    factor, apply the wrong one."""
    log2 = [3, -2, 5]
    n_heads, n_kv = model.config.num_attention_heads, model.config.num_key_value_heads
    _o_columns(model, lambda h: log2[h // (n_heads // n_kv)] - log2[h % n_kv])


@pytest.mark.parametrize("fixture, break_it", [("smol_rescaled", _wrong_o_factor), ("smol_rescaled", _q_not_scaled),
                                               ("smol_per_head_v", _gqa_by_modulo)],
                         ids=["o_proj-wrong-factor", "q_proj-not-scaled", "gqa-columns-by-modulo"])
def test_a_broken_rescale_changes_the_logits(request, fixture, break_it):
    dst, _ = request.getfixturevalue(fixture)
    logits0, _ = _run(SMOL, torch.bfloat16)
    model = _load(dst, torch.bfloat16)
    intact, _ = _forward(model, _ids(SMOL))
    assert torch.equal(intact, logits0)
    break_it(model)
    broken, _ = _forward(model, _ids(SMOL))
    assert (broken.float() - logits0.float()).abs().max() > 0.1


@pytest.fixture(scope="module")
def gemma_rescaled(tmp_path_factory):
    _need(GEMMA)
    dst = tmp_path_factory.mktemp("rescaled") / "gemma-v3"
    return dst, rescale(GEMMA, dst, v_log2=GEMMA_V_LOG2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_gemma3_v_rescale_is_bit_identical(gemma_rescaled, dtype):
    dst, facts = gemma_rescaled
    assert (facts["num_attention_heads"], facts["num_key_value_heads"], facts["head_dim"]) == (4, 1, 256)
    assert len(facts["tensors_changed"]) == 2 * facts["layers"]
    logits0, caps0 = _run(GEMMA, dtype)
    logits1, caps1 = _run(dst, dtype)
    assert torch.equal(logits0, logits1)
    for v0, v1 in zip(caps0["v_proj"], caps1["v_proj"]):
        assert torch.equal(v1, v0 * 2.0 ** GEMMA_V_LOG2)
    for which in ("q_proj", "k_proj"):
        assert all(torch.equal(x0, x1) for x0, x1 in zip(caps0[which], caps1[which]))


def test_refusals_leave_nothing_behind(tmp_path):
    _need(SMOL)
    _need(GEMMA)
    with pytest.raises(ValueError, match="k_norm"):
        rescale(GEMMA, tmp_path / "g", k_outlier_log2=4)
    with pytest.raises(ValueError, match="subnormal or zero"):
        rescale(SMOL, tmp_path / "s", v_log2=-120)
    with pytest.raises(ValueError, match="overflow"):
        rescale(SMOL, tmp_path / "s", k_outlier_log2=130)  # k_proj (up) is checked before q_proj (down)
    with pytest.raises(ValueError, match="3 KV heads"):
        rescale(SMOL, tmp_path / "s", v_log2=[1, 2])
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(FileExistsError):
        rescale(SMOL, tmp_path / "full", v_log2=1)


def test_scaled_weights_are_checked():
    w = torch.tensor([[1.0, -3.0], [2.0 ** -125, 0.0]], dtype=torch.bfloat16)
    assert torch.equal(_scaled("w", w, 0, torch.tensor([2.0 ** 5, 2.0 ** 3], dtype=torch.float64)),
                       torch.tensor([[32.0, -96.0], [2.0 ** -122, 0.0]], dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="overflow"):
        _scaled("w", w, 1, torch.tensor([2.0 ** 128, 1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="subnormal or zero"):  # 2**-125 / 4 is a bf16 subnormal
        _scaled("w", w, 0, torch.tensor([1.0, 2.0 ** -2], dtype=torch.float64))
    sub = torch.tensor([3 * 2.0 ** -133], dtype=torch.bfloat16)  # a subnormal whose last bit a halving drops
    with pytest.raises(ValueError, match="not exact"):
        _scaled("b", sub, 0, torch.tensor([0.5], dtype=torch.float64))

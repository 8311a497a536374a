"""Function-preserving rescaling of a Hugging Face checkpoint: the same model, with a KV cache of another range.

    .venv/bin/python integration/rescale_checkpoint.py SRC DST --v-log2 A [--k-outlier-log2 B]

- ``--v-log2 A``: every layer's V times 2**A (v_proj's weight rows, and bias, times 2**A) and o_proj's input columns
  times 2**-A. o_proj's in_features are laid out per query head (num_attention_heads blocks of head_dim); query head
  h reads the V of KV head h // (num_attention_heads // num_key_value_heads), so the column blocks of every query
  head of KV group g take the inverse of V head g's factor. Refused when the model has a v_norm.
- ``--k-outlier-log2 B``: in every KV head, two rotary pairs of K (channels i and i + d/2 for i in (3, 37) modulo
  d/2) times 2**B: those rows of k_proj times 2**B, the same channels of q_proj's rows of every query head in that
  KV group times 2**-B, so q.k is unchanged. HF Llama-format checkpoints rotate with ``rotate_half`` (pairs
  (i, i + d/2), no interleave; SGLang's Llama uses the same neox-style rope), and a pair scaled as one commutes with
  the rotation. Refused for models with a k_norm (Gemma-3, Qwen3): the norm re-normalises K per head, and Gemma's
  (1 + weight) parametrisation cannot scale one channel down exactly in bf16.

Powers of two are exact in binary floating point unless a value overflows or leaves the normal range, so every
scaled tensor is checked: refused if any value would overflow, become subnormal or zero when it was not, or fail to
round-trip (scaled, stored in its dtype, divided back) to the original bits. Tensors keep their stored dtype.
Activations are not checked: a model whose activations are far from both ends of the range (any realistic |A|,
|B| < ~60) computes the same numbers, bit for bit, in bf16 and float32 (tests/test_rescale_checkpoint.py).

DST gets every other file of SRC copied (config, tokenizer, shard index), except ``inkling_prepared.json`` (it
records SRC's file hashes), and a ``rescale.json`` with what was done (the facts ``rescale`` returns).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SKIPPED_FILES = {"inkling_prepared.json", "rescale.json"}
_ATTN = re.compile(r"^(?P<layer>(?:.*\.)?layers\.(?P<idx>\d+))\.self_attn\.(?P<what>[a-z_]+)\.(?P<kind>weight|bias)$")


def outlier_channels(d: int) -> list[int]:
    """Two rotary pairs (i, i + d/2) for i in (3, 37) modulo d/2 (as integration/kv_format_error.py):
    [3, 3 + d/2, 37, 37 + d/2] for head_dim 256, [3, 35, 5, 37] for head_dim 64."""
    half = d // 2
    return [c for i in (3, 37) for c in (i % half, i % half + half)]


def _text_config(cfg: dict) -> dict:
    return cfg.get("text_config") or cfg


def _geometry(cfg: dict) -> tuple[int, int, int]:
    """(num_attention_heads, num_key_value_heads, head_dim)."""
    n_heads = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_heads
    d = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    if n_heads % n_kv:
        raise ValueError(f"num_attention_heads {n_heads} is not a multiple of num_key_value_heads {n_kv}")
    return n_heads, n_kv, d


def _per_kv_head(log2: int | Sequence[int], n_kv: int, what: str) -> list[int]:
    """One exponent per KV head: an int for all of them, or (V only, as the tests use it) one per head."""
    values = [int(x) for x in log2] if isinstance(log2, Sequence) else [int(log2)] * n_kv
    if len(values) != n_kv:
        raise ValueError(f"{what}: {len(values)} exponents for {n_kv} KV heads")
    return values


def _factor_vectors(cfg: dict, v_log2: list[int], k_log2: list[int]) -> dict[str, tuple[int, torch.Tensor]]:
    """Per projection: (the dim scaled: 0 = output rows, 1 = input columns, float64 factor per row/column)."""
    n_heads, n_kv, d = _geometry(cfg)
    group = n_heads // n_kv
    two = torch.tensor(2.0, dtype=torch.float64)
    out: dict[str, tuple[int, torch.Tensor]] = {}
    if any(v_log2):
        v_rows = torch.cat([two.pow(a).repeat(d) for a in v_log2])                       # V head g: 2**A_g
        o_cols = torch.cat([two.pow(-v_log2[h // group]).repeat(d) for h in range(n_heads)])  # q head h: 2**-A_g
        out["v_proj"], out["o_proj"] = (0, v_rows), (1, o_cols)
    if any(k_log2):
        k_rows = torch.ones(n_kv * d, dtype=torch.float64)
        q_rows = torch.ones(n_heads * d, dtype=torch.float64)
        for c in outlier_channels(d):
            for g in range(n_kv):
                k_rows[g * d + c] = two.pow(k_log2[g])
            for h in range(n_heads):
                q_rows[h * d + c] = two.pow(-k_log2[h // group])
        out["k_proj"], out["q_proj"] = (0, k_rows), (0, q_rows)
    return out


def _scaled(name: str, w: torch.Tensor, dim: int, factor: torch.Tensor) -> torch.Tensor:
    """w with its rows (dim 0) or columns (dim 1) times ``factor``, in w's dtype, exactly, or a ValueError."""
    if w.shape[dim] != factor.numel():
        raise ValueError(f"{name}: {w.shape[dim]} {'rows' if dim == 0 else 'columns'}, expected {factor.numel()}")
    f = factor.view(-1, 1) if dim == 0 and w.dim() == 2 else factor
    if dim == 1 and w.dim() != 2:
        raise ValueError(f"{name}: expected a matrix, got shape {tuple(w.shape)}")
    wide = w.double()
    x = wide * f
    info = torch.finfo(w.dtype)
    over = ~torch.isfinite(x) | (x.abs() > info.max)
    if over.any():
        raise ValueError(f"{name}: {int(over.sum())} values would overflow {w.dtype} (max |w| "
                         f"{wide.abs().max().item():.4g}, factor up to {factor.max().item():g})")
    y = x.to(w.dtype)
    lost = (wide.abs() >= info.tiny) & (y.double().abs() < info.tiny)
    if lost.any():
        raise ValueError(f"{name}: {int(lost.sum())} values would become subnormal or zero in {w.dtype} "
                         f"(smallest nonzero |w| {wide[wide != 0].abs().min().item():.4g}, "
                         f"factor down to {factor.min().item():g})")
    if not torch.equal(y.double() / f, wide):
        raise ValueError(f"{name}: scaling is not exact in {w.dtype} (subnormal weights?)")
    return y.contiguous()


def _shards(src: Path) -> list[Path]:
    shards = sorted(src.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors in {src}")
    return shards


def _names(shards: list[Path]) -> list[str]:
    names = []
    for shard in shards:
        with safe_open(shard, "pt") as f:
            names.extend(f.keys())
    return names


def _check_model(cfg: dict, names: list[str], v_log2: list[int], k_log2: list[int]) -> list[str]:
    """The attention layers' name prefixes, after the refusals (norms, missing or fused projections, rotary)."""
    layers: dict[int, str] = {}
    parts: dict[str, set[str]] = {}
    for name in names:
        m = _ATTN.match(name)
        if m:
            layers[int(m["idx"])] = m["layer"]
            parts.setdefault(m["layer"], set()).add(m["what"])
    if len(layers) != cfg["num_hidden_layers"] or sorted(layers) != list(range(cfg["num_hidden_layers"])):
        raise ValueError(f"found self_attn tensors for layers {sorted(layers)}, config has "
                         f"num_hidden_layers {cfg['num_hidden_layers']}")
    for prefix, what in parts.items():
        missing = {"q_proj", "k_proj", "v_proj", "o_proj"} - what
        if missing:
            raise ValueError(f"{prefix}.self_attn has no {sorted(missing)} (fused projections are not supported)")
        if any(v_log2) and what & {"v_norm", "v_layernorm"}:
            raise ValueError(f"{prefix}.self_attn has a v_norm: it would undo a V rescaling; refused")
        if any(k_log2) and what & {"k_norm", "k_layernorm", "q_norm", "q_layernorm"}:
            norms = sorted(what & {"k_norm", "k_layernorm", "q_norm", "q_layernorm"})
            raise ValueError(f"{prefix}.self_attn has {'/'.join(norms)}: a k_norm re-normalises each K head, and "
                             "Gemma's (1 + weight) k_norm cannot scale a channel down exactly in bf16; K outlier "
                             "rescaling is only for models without a k_norm (Llama, SmolLM2)")
    if any(k_log2):
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        if partial != 1.0 or cfg.get("rotary_dim") not in (None, _geometry(cfg)[2]):
            raise ValueError("partial rotary embedding: the (i, i + d/2) pair layout does not hold; refused")
        if cfg.get("rope_is_neox_style", True) is not True:
            raise ValueError("rope_is_neox_style is false (interleaved pairs): refused")
    return [layers[i] for i in sorted(layers)]


def _write(src: Path, partial: Path, shards: list[Path], prefixes: list[str],
           vectors: dict[str, tuple[int, torch.Tensor]]) -> list[str]:
    """The rescaled shards and the copied files in ``partial``; the names of the tensors changed."""
    changed: list[str] = []
    wanted = {f"{p}.self_attn.{proj}.{kind}": proj for p in prefixes for proj in vectors for kind in ("weight", "bias")}
    for shard in shards:
        with safe_open(shard, "pt") as f:
            metadata = f.metadata()
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        for name, w in tensors.items():
            proj = wanted.get(name)
            if proj is None:
                continue
            dim, factor = vectors[proj]
            if name.endswith(".bias"):
                if dim == 1:  # o_proj's bias is added after the columns: unchanged
                    continue
                dim = 0
            tensors[name] = _scaled(name, w, dim, factor)
            changed.append(name)
        save_file(tensors, str(partial / shard.name), metadata=metadata)
    for item in src.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name not in SKIPPED_FILES:
            shutil.copy2(item, partial / item.name)
    return changed


def rescale(src: Path, dst: Path, v_log2: int | Sequence[int] = 0, k_outlier_log2: int = 0) -> dict:
    """Write the rescaled checkpoint of ``src`` to ``dst`` (must not exist or be empty) and return the facts:
    exponents, factors, head geometry, K channels, and the names of the tensors changed. ``v_log2`` may also be a
    list with one exponent per KV head (the tests use that to check the GQA column mapping)."""
    src, dst = Path(src), Path(dst)
    cfg_full = json.loads((src / "config.json").read_text())
    cfg = _text_config(cfg_full)
    n_heads, n_kv, d = _geometry(cfg)
    v = _per_kv_head(v_log2, n_kv, "v_log2")
    k = _per_kv_head(k_outlier_log2, n_kv, "k_outlier_log2")
    if len(set(k)) != 1:
        raise ValueError("k_outlier_log2 is one exponent for every KV head")
    shards = _shards(src)
    prefixes = _check_model(cfg, _names(shards), v, k)
    vectors = _factor_vectors(cfg, v, k)
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"{dst} exists and is not empty")
    partial = dst.with_name(dst.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        changed = _write(src, partial, shards, prefixes, vectors)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    facts = {
        "src": str(src), "model_type": cfg.get("model_type"),
        "num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": d, "layers": len(prefixes),
        "v_log2": v[0] if len(set(v)) == 1 else v,
        "v_factor": 2.0 ** v[0] if len(set(v)) == 1 else [2.0 ** a for a in v],
        "k_outlier_log2": k[0], "k_factor": 2.0 ** k[0], "q_factor": 2.0 ** -k[0],
        "k_channels": outlier_channels(d) if k[0] else [],
        "tensors_changed": changed,
    }
    (partial / "rescale.json").write_text(json.dumps(facts, indent=1) + "\n")
    if dst.exists():
        dst.rmdir()
    partial.rename(dst)
    return facts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--v-log2", type=int, default=0, help="V times 2**A (o_proj columns times 2**-A)")
    parser.add_argument("--k-outlier-log2", type=int, default=0,
                        help="two rotary pairs of K per head times 2**B (q_proj's channels times 2**-B)")
    args = parser.parse_args(argv)
    if not args.v_log2 and not args.k_outlier_log2:
        parser.error("nothing to do: give --v-log2 and/or --k-outlier-log2 (nonzero)")
    try:
        facts = rescale(args.src, args.dst, args.v_log2, args.k_outlier_log2)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        sys.exit(f"rescale_checkpoint: {e}")
    print(json.dumps({key: value for key, value in facts.items() if key != "tensors_changed"}
                     | {"tensors_changed": len(facts["tensors_changed"])}))


if __name__ == "__main__":
    main()

"""KV-cache bytes per token for a Hugging Face model config, from the core's per-layer count."""
import json
from dataclasses import dataclass
from pathlib import Path

from sglang_inkling_backend.kv_formats import bytes_per_token_per_layer


@dataclass(frozen=True)
class KVGeometry:
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_model_dir(cls, model_dir: Path | str) -> "KVGeometry":
        config = json.loads((Path(model_dir) / "config.json").read_text())
        config = config.get("text_config", config)
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        return cls(num_layers=config["num_hidden_layers"],
                   num_kv_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
                   head_dim=head_dim)

    def kv_heads_per_rank(self, tp_size: int = 1) -> int:
        """SGLang's QKVParallelLinear split: KV heads divided across ranks, one replicated head per rank when
        tp_size >= num_kv_heads."""
        if tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {tp_size}")
        if tp_size >= self.num_kv_heads:
            return 1
        if self.num_kv_heads % tp_size:
            raise ValueError(f"tp_size {tp_size} does not split this model's {self.num_kv_heads} KV heads")
        return self.num_kv_heads // tp_size

    def bytes_per_token(self, kv_format: str, tp_size: int = 1) -> int:
        """Bytes one token's K and V take across all layers, on one tensor-parallel rank."""
        return self.num_layers * bytes_per_token_per_layer(self.kv_heads_per_rank(tp_size), self.head_dim, kv_format)

"""sglang-inkling-backend: MXFP8-KV and hybrid sliding-window attention for SGLang and vLLM.

The core (formats, scale layout, layer plan, pool, reference) imports only torch; hosts
(``sglang_inkling_backend.hosts.sglang``, ``.hosts.vllm``) and accelerators (``.triton``, ``.mlx``) import the core, never the reverse.
"""

from . import mxfp8
from .kv_pool import HostKVTier, InklingKVPool, bytes_per_token, tokens_that_fit
from .layer_plan import LayerPlan, LayerSpec, LogScaling
from .scale_layout import ScaleLayout

__version__ = "0.1.0"

__all__ = ["mxfp8", "HostKVTier", "InklingKVPool", "bytes_per_token", "tokens_that_fit", "LayerPlan", "LayerSpec",
           "LogScaling", "ScaleLayout"]

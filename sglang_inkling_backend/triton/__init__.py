"""Triton kernels (NVIDIA/AMD): paged decode attention, extend attention and the fused MXFP8 K/V store.

On a machine without a GPU they run under the Triton interpreter (``TRITON_INTERPRET=1``, set before the first
import of this package), which is how the CPU tests exercise them.
"""

from .decode_attention import DecodePlan, check_decode_inputs, paged_decode_attention, plan_decode, run_decode
from .extend_attention import paged_extend_attention
from .kv_store import store_kv_mxfp8

__all__ = ["DecodePlan", "check_decode_inputs", "paged_decode_attention", "plan_decode", "run_decode",
           "paged_extend_attention", "store_kv_mxfp8"]

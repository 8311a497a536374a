"""FlashInfer as kernel families, for layers whose semantics are FlashInfer's: an extend's attention (prefill,
chunked prefill, a prefix hit) through its ragged prefill (FA3 on Hopper, FA2 elsewhere), and a 16-bit pool's
decode through its paged decode.

Importing this package imports neither FlashInfer nor Triton; ``extend_family(device)`` and
``decode_family(device)`` import FlashInfer, and say why not when they cannot serve. ``extend.FlashInferExtend`` and
``decode.FlashInferDecode`` are the families; ``gpu.route.GpuRoute`` calls them for the layers they serve and
hands the extend family the K/V gather it reads through. This package imports no other kernel family.
"""

from .decode import DECODE_KERNEL_ENV, FlashInferDecode, decode_family
from .extend import EXTEND_KERNEL_ENV, FlashInferExtend, FlashInferExtendPlan, effective_scales, extend_family

__all__ = ["DECODE_KERNEL_ENV", "EXTEND_KERNEL_ENV", "FlashInferDecode", "FlashInferExtend", "FlashInferExtendPlan",
           "decode_family", "effective_scales", "extend_family"]

"""FlashInfer as a kernel family: an extend's attention (prefill, chunked prefill, a prefix hit) through FlashInfer's
ragged prefill (FA3 on Hopper, FA2 elsewhere), for layers whose semantics are FlashInfer's.

Importing this package imports neither FlashInfer nor Triton; ``extend_family(device)`` does, and says why not when
it cannot serve. ``extend.FlashInferExtend`` is the family; ``triton.route.TritonRoute`` calls it for the layers
it serves.
"""

from .extend import EXTEND_KERNEL_ENV, FlashInferExtend, extend_family

__all__ = ["EXTEND_KERNEL_ENV", "FlashInferExtend", "extend_family"]

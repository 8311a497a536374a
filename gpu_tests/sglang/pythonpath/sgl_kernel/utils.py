"""``sgl_kernel.utils`` names SGLang's triton attention backend calls at construction."""
import functools

import torch


@functools.lru_cache(maxsize=None)
def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch needs sm_90 or newer (as the real wheel decides)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9

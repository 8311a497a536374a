"""Unit tests run on the CPU: Triton kernels run under its interpreter there. The variable must be set before the
first import of triton anywhere in the session (sglang imports it too), so it is set here, before any test module."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

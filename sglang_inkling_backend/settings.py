"""Every environment variable the package reads, in one place, each with one meaning.

A setting is read when it is asked for, so a launcher or a test may set it before the first use; a module that
needs one on a hot path takes it once (a route at construction, a host adapter at start-up). A value outside a
setting's choices is a ValueError naming the variable. The README's settings table lists the same names
(``tests/test_docs_settings.py`` checks it against ``SETTINGS``).

Flags (``INKLING_E4M3_BY_INTEGERS``, ``INKLING_DISABLE_HOPPER_DECODE``, ``TRITON_INTERPRET``) are on for any value
but the empty string and ``0``. Core module: no host, no accelerator.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Setting:
    name: str
    default: Optional[str]  # None: a flag (off unless set to something but "" or "0") or a path (unset: none)
    choices: tuple = ()  # empty: any value
    meaning: str = ""


KERNEL_CHOICES = ("auto", "triton", "flashinfer")  # auto: FlashInfer where it serves the layer
EXTEND_NEW_KEYS_CHOICES = ("forward", "cache")
QUERY_FORMATS = ("bf16", "mxfp8")
DEFAULT_QUERY_FORMAT = "bf16"

DECODE_KERNEL = Setting("INKLING_DECODE_KERNEL", "auto", KERNEL_CHOICES,
                        "the decode kernel family: FlashInfer where it serves the layer (auto), or one forced")
EXTEND_KERNEL = Setting("INKLING_EXTEND_KERNEL", "auto", KERNEL_CHOICES,
                        "the extend kernel family: FlashInfer where it serves the layer (auto), or one forced")
EXTEND_NEW_KEYS = Setting("INKLING_EXTEND_NEW_KEYS", "forward", EXTEND_NEW_KEYS_CHOICES,
                          "where an extend reads its own new keys: the forward's K/V, or the cache as stored")
VERIFY_GRAPHS = Setting("INKLING_VERIFY_GRAPHS", "1", ("0", "1"),
                        "speculative verify steps under CUDA graphs (SGLang, Triton route)")
MXFP8_QUERY = Setting("INKLING_MXFP8_QUERY", DEFAULT_QUERY_FORMAT, QUERY_FORMATS,
                      "the Inkling model's query in MXFP8 mode: unrounded bf16, or rounded as FA4 takes it")
E4M3_BY_INTEGERS = Setting("INKLING_E4M3_BY_INTEGERS", None, (),
                           "8-bit pools read as bytes, e4m3 decoded with integer operations, on any device")
DISABLE_HOPPER_DECODE = Setting("INKLING_DISABLE_HOPPER_DECODE", None, (),
                                "MXFP8 decode through the Triton kernels only, never the Gluon Hopper kernel")
SGLANG_CPU_SHIMS = Setting("INKLING_SGLANG_CPU_SHIMS", None, (),
                           "the directory of the SGLang CPU shims (default: the checkout's third_party/sglang_cpu)")
TRITON_INTERPRET = Setting("TRITON_INTERPRET", None, (), "Triton's interpreter (Triton's own variable)")
# Read, not owned: the host's own switches this package looks at.
SGLANG_USE_CPU_ENGINE = Setting("SGLANG_USE_CPU_ENGINE", None, (), "SGLang's CPU engine (SGLang's own variable)")
VLLM_TARGET_DEVICE = Setting("VLLM_TARGET_DEVICE", None, (), "vLLM's target device (vLLM's own variable)")

SETTINGS = (DECODE_KERNEL, EXTEND_KERNEL, EXTEND_NEW_KEYS, VERIFY_GRAPHS, MXFP8_QUERY, E4M3_BY_INTEGERS,
            DISABLE_HOPPER_DECODE, SGLANG_CPU_SHIMS)  # this package's own: the README's settings table
HOST_SETTINGS = (TRITON_INTERPRET, SGLANG_USE_CPU_ENGINE, VLLM_TARGET_DEVICE)


def raw(setting: Setting) -> Optional[str]:
    """The variable as set (None when unset): the one ``os.environ`` read of the package."""
    return os.environ.get(setting.name)


def choice(setting: Setting) -> str:
    """A setting with choices: its value (the default when unset or empty, compared in lower case); a ValueError
    naming the variable and its choices for any other value."""
    value = (raw(setting) or "").strip().lower() or setting.default
    if value not in setting.choices:
        raise ValueError(f"{setting.name} must be one of {setting.choices}, got {raw(setting)!r}")
    return value


def flag(setting: Setting) -> bool:
    """A flag: on for any value but unset, the empty string and ``0``."""
    return (raw(setting) or "0").strip() not in ("", "0")


def decode_kernel() -> str:
    return choice(DECODE_KERNEL)


def extend_kernel() -> str:
    return choice(EXTEND_KERNEL)


def kernel_family(name: str) -> str:
    """``INKLING_DECODE_KERNEL`` or ``INKLING_EXTEND_KERNEL``, by the variable's name."""
    for setting in (DECODE_KERNEL, EXTEND_KERNEL):
        if setting.name == name:
            return choice(setting)
    raise ValueError(f"name must be {DECODE_KERNEL.name} or {EXTEND_KERNEL.name}, got {name!r}")


def extend_new_keys() -> str:
    return choice(EXTEND_NEW_KEYS)


def verify_graphs() -> bool:
    return choice(VERIFY_GRAPHS) == "1"


def mxfp8_query() -> str:
    return choice(MXFP8_QUERY)


def mxfp8_query_unrounded() -> bool:
    """``INKLING_MXFP8_QUERY`` is bf16: the Inkling model's q reaches attention unrounded in MXFP8 mode."""
    return mxfp8_query() == "bf16"


def e4m3_by_integers_forced() -> bool:
    return flag(E4M3_BY_INTEGERS)


def hopper_decode_disabled() -> bool:
    return flag(DISABLE_HOPPER_DECODE)


def triton_interpreter() -> bool:
    return flag(TRITON_INTERPRET)


def sglang_cpu_shims() -> Optional[str]:
    return raw(SGLANG_CPU_SHIMS) or None


def sglang_cpu_engine() -> bool:
    return raw(SGLANG_USE_CPU_ENGINE) == "1"  # SGLang's own test of its variable


def vllm_target_device() -> Optional[str]:
    return raw(VLLM_TARGET_DEVICE)

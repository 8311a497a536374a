"""Which SGLang versions this host adapter supports, and the check that says so clearly.

The adapter reaches into SGLang internals that change between releases (the attention registry, the resolution
pipeline, the KV-pool configurator, the Inkling model's seam), so it declares an exact, tested range instead of
half-working on another release.
"""
from __future__ import annotations

import re
from importlib import metadata

# Tested: 0.5.23. Patch releases of 0.5.23 (0.5.23.postN) are accepted; anything else is refused.
SUPPORTED_SGLANG = ((0, 5, 23), (0, 5, 24))  # [lower, upper)
SUPPORTED_SGLANG_TEXT = ">=0.5.23,<0.5.24"


class UnsupportedSGLangVersion(RuntimeError):
    """The installed SGLang is outside the range this adapter was written and tested against."""


def parse_release(version: str) -> tuple[int, int, int]:
    """``'0.5.23.post1'`` -> ``(0, 5, 23)``. Raises ValueError for a string with no X.Y.Z release part."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"cannot read a release number X.Y.Z from SGLang version {version!r}")
    return tuple(int(part) for part in match.groups())  # type: ignore[return-value]


def installed_sglang_version() -> str:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        import sglang  # an importable source tree without dist-info

        return getattr(sglang, "__version__", "unknown")


def check_sglang_version(version: str | None = None) -> str:
    """Return the installed (or given) SGLang version if supported; raise UnsupportedSGLangVersion otherwise."""
    version = installed_sglang_version() if version is None else version
    try:
        release = parse_release(version)
    except ValueError as err:
        raise UnsupportedSGLangVersion(
            f"--attention-backend inkling (sglang-inkling-backend) supports sglang {SUPPORTED_SGLANG_TEXT}; {err}"
        ) from err
    lower, upper = SUPPORTED_SGLANG
    if not lower <= release < upper:
        raise UnsupportedSGLangVersion(
            f"--attention-backend inkling (sglang-inkling-backend) supports sglang {SUPPORTED_SGLANG_TEXT}, but "
            f"sglang {version} is installed. "
            f"Install a supported SGLang (pip install 'sglang{SUPPORTED_SGLANG_TEXT}') or an "
            "sglang-inkling-backend release made for sglang " + version + ".")
    return version

"""Keep only what one GPU architecture can load in a shared library's CUDA fat binaries (test-only).

A ``.nv_fatbin`` section holds one fat binary per translation unit: a 16-byte header (magic ``0xBA55ED50``, version,
header size, size of the entries) and entries, each a header (kind 1 = PTX, 2 = ELF/SASS; payload size; target
architecture at byte 28) and its payload. SASS runs only on its own major architecture, so an sm_90 GPU loads an
entry's sm_90 ELF, or JIT-compiles its PTX of arch <= 9.0 where it has no sm_90 ELF. ``strip_fatbins`` zeroes every
other payload in place (headers, offsets and sizes unchanged, so the library links and registers exactly as
before) and the zeros compress to nothing: vLLM 0.33's ``_C_stable_libtorch.abi3.so`` (93 MB, 63.7 MB as xz) keeps
13 MB of its 58 MB of fat binaries for sm_90 (16.5 MB as xz after ``strip --strip-unneeded``).
"""
from __future__ import annotations

import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2


@dataclass(frozen=True)
class Entry:
    kind: int
    arch: int  # 90 for sm_90 and sm_90a
    payload: int  # offset of the payload in the file
    size: int


def fatbin_section(path: Path) -> tuple[int, int]:
    """(file offset, size) of ``.nv_fatbin`` (readelf)."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if " .nv_fatbin " in line:
            fields = line.split("]", 1)[1].split()
            return int(fields[3], 16), int(fields[4], 16)
    raise ValueError(f"{path}: no .nv_fatbin section")


def fatbins(data: bytes, offset: int, size: int) -> list[list[Entry]]:
    """The entries of each fat binary in ``data[offset:offset + size]`` (fat binaries are 8-byte aligned)."""
    out, pos, end = [], offset, offset + size
    while pos + 16 <= end:
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
        if magic != FATBIN_MAGIC:
            pos += 8
            continue
        entries, e, stop = [], pos + header_size, pos + header_size + fat_size
        while e < stop:
            kind, _v, entry_header, payload_size = struct.unpack_from("<HHIQ", data, e)
            arch = struct.unpack_from("<I", data, e + 28)[0]
            entries.append(Entry(kind, arch, e + entry_header, payload_size))
            e += entry_header + payload_size
        if e != stop:
            raise ValueError(f"fat binary at {pos:#x}: entries end at {e:#x}, its header says {stop:#x}")
        out.append(entries)
        pos = stop
    return out


def loadable(entries: list[Entry], arch: int) -> list[Entry]:
    """What a GPU of ``arch`` loads from one fat binary: its ELF of that architecture, else its newest PTX <= arch."""
    same = [e for e in entries if e.kind == KIND_ELF and e.arch == arch]
    if same:
        return same
    ptx = [e for e in entries if e.kind == KIND_PTX and e.arch <= arch]
    newest = max((e.arch for e in ptx), default=None)
    return [e for e in ptx if e.arch == newest]


def strip_fatbins(data: bytearray, offset: int, size: int, arch: int) -> tuple[int, int]:
    """Zero, in ``data``, every payload a GPU of ``arch`` does not load. Returns (bytes kept, bytes zeroed)."""
    kept = zeroed = 0
    for entries in fatbins(bytes(data), offset, size):
        keep = set(loadable(entries, arch))
        for e in entries:
            if e in keep:
                kept += e.size
            else:
                data[e.payload:e.payload + e.size] = bytes(e.size)
                zeroed += e.size
    return kept, zeroed


def strip_library(src: Path, dst: Path, arch: int = 90) -> tuple[int, int]:
    data = bytearray(src.read_bytes())
    offset, size = fatbin_section(src)
    result = strip_fatbins(data, offset, size, arch)
    dst.write_bytes(bytes(data))
    return result

"""Run the Inkling Metal kernel sources on a Linux CPU.

A kernel launch on Apple goes through ``mx.fast.metal_kernel(name, input_names, output_names, source,
header)`` and is called with ``inputs, output_shapes, output_dtypes, grid, threadgroup, template``.
``CpuMetalKernel`` takes exactly that description (the same ``MetalKernelSpec`` and ``MetalLaunch``
objects the MLX wrappers build) and instead:

1. writes a C++ translation unit that includes ``metal_shim.h``, the kernel's header source, and a
   function whose parameters are named and typed as MLX would generate them (``const device T* q``,
   ``device uint8_t* k_data``, ``uint3 thread_position_in_grid``) with the kernel body ``#include``d
   verbatim as its body; template arguments become namespace-scope constants;
2. compiles it with g++ -std=c++17 under AddressSanitizer + UndefinedBehaviorSanitizer (every buffer is
   a heap allocation of its exact size, so any out-of-bounds read or write aborts the run);
3. runs every thread of the grid sequentially, in forward, reverse or shuffled order, with the outputs
   pre-filled with a sentinel byte, and returns the outputs as numpy arrays.

Running twice with two orders and two sentinels and comparing finds output elements no thread writes
(they keep the sentinel) and results that depend on thread order (two threads writing one element, or a
thread reading another's output).

What it cannot see: threadgroup memory and barriers, simdgroup functions, atomics (the shim leaves them
undefined, so such kernels do not compile here), the Metal compiler's own diagnostics and its
fast-math/FMA contraction, GPU denormal handling, real concurrency (memory-model races), and timing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

SHIM_DIR = Path(__file__).resolve().parent

# MLX dtype name -> (C++ type in the shim, numpy dtype used to carry the bytes)
_DTYPES = {
    "float32": ("float", np.float32),
    "float16": ("float16_t", np.float16),
    "bfloat16": ("bfloat16_t", np.uint16),
    "int32": ("int32_t", np.int32),
    "uint32": ("uint32_t", np.uint32),
    "uint8": ("uint8_t", np.uint8),
}

_COMPILE_FLAGS = (
    "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Wno-unused-parameter",
    "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer",
    "-ffp-contract=off",
    # warnings are errors with the g++ CI uses; other compilers (Apple clang on a Mac) warn differently
    *(("-Werror",) if sys.platform.startswith("linux") else ()),
)

_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

static std::vector<char> read_file(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) { std::perror(path.c_str()); std::exit(2); }
    std::fseek(f, 0, SEEK_END);
    long n = std::ftell(f);
    std::fseek(f, 0, SEEK_SET);
    std::vector<char> bytes(n);
    if (n > 0 && std::fread(bytes.data(), 1, n, f) != size_t(n)) { std::exit(2); }
    std::fclose(f);
    return bytes;
}

int main(int argc, char** argv) {
    // argv: dir gx gy gz order seed sentinel out_bytes...
    if (argc != 8 + NUM_OUTPUTS) { std::fprintf(stderr, "bad argument count\n"); return 2; }
    const std::string dir = argv[1];
    const uint grid[3] = {uint(std::atoi(argv[2])), uint(std::atoi(argv[3])), uint(std::atoi(argv[4]))};
    const std::string order = argv[5];
    const unsigned seed = unsigned(std::atoi(argv[6]));
    const int sentinel = std::atoi(argv[7]);
    void* in[NUM_INPUTS > 0 ? NUM_INPUTS : 1];
    void* out[NUM_OUTPUTS];
    size_t out_bytes[NUM_OUTPUTS];
    for (int i = 0; i < NUM_INPUTS; ++i) {
        std::vector<char> bytes = read_file(dir + "/in_" + std::to_string(i) + ".bin");
        in[i] = std::malloc(bytes.size() ? bytes.size() : 1);  // exact size: ASan sees any overrun
        std::memcpy(in[i], bytes.data(), bytes.size());
    }
    for (int i = 0; i < NUM_OUTPUTS; ++i) {
        out_bytes[i] = size_t(std::atoll(argv[8 + i]));
        out[i] = std::malloc(out_bytes[i] ? out_bytes[i] : 1);
        std::memset(out[i], sentinel, out_bytes[i]);
    }
    std::vector<uint3> threads;
    for (uint z = 0; z < grid[2]; ++z)
        for (uint y = 0; y < grid[1]; ++y)
            for (uint x = 0; x < grid[0]; ++x) threads.push_back(uint3{x, y, z});
    if (order == "reverse") {
        std::reverse(threads.begin(), threads.end());
    } else if (order == "shuffle") {
        std::mt19937 rng(seed);
        std::shuffle(threads.begin(), threads.end(), rng);
    }
    for (const uint3& t : threads) {
        LAUNCH_ONE_THREAD(t);
    }
    for (int i = 0; i < NUM_OUTPUTS; ++i) {
        const std::string path = dir + "/out_" + std::to_string(i) + ".bin";
        FILE* f = std::fopen(path.c_str(), "wb");
        if (!f || std::fwrite(out[i], 1, out_bytes[i], f) != out_bytes[i]) { return 2; }
        std::fclose(f);
        std::free(out[i]);
    }
    for (int i = 0; i < NUM_INPUTS; ++i) std::free(in[i]);
    return 0;
}
"""


def compiler_available() -> bool:
    return shutil.which(os.environ.get("CXX", "g++")) is not None


def _dtype_name(dtype) -> str:
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in _DTYPES:
        raise TypeError(f"dtype {dtype} has no C++ stand-in; expected one of {sorted(_DTYPES)}")
    return name


def _template_line(name: str, value) -> str:
    if isinstance(value, bool):
        return f"static constexpr bool {name} = {'true' if value else 'false'};"
    if isinstance(value, int):
        return f"static constexpr int {name} = {value};"
    return f"using {name} = {_DTYPES[_dtype_name(value)][0]};"


def _to_numpy(array) -> np.ndarray:
    """mx.array or numpy -> numpy carrying the same bytes (bfloat16 as uint16)."""
    if isinstance(array, np.ndarray):
        return np.ascontiguousarray(array)
    import mlx.core as mx

    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    return np.ascontiguousarray(np.array(array))


class CpuMetalKernel:
    """A Metal kernel body compiled as C++ under the shim; called like ``mx.fast.metal_kernel``."""

    def __init__(self, spec, cache_dir: str | os.PathLike | None = None):
        self.spec = spec
        self.cache_dir = Path(cache_dir or Path(tempfile.gettempdir()) / "inkling_metal_cpu")
        self.cache_dir.mkdir(parents=True, exist_ok=True)

    def _source(self, input_dtypes: Sequence[str], output_dtypes: Sequence[str], template) -> str:
        spec = self.spec
        params = [f"const device {_DTYPES[d][0]}* {n}" for n, d in zip(spec.input_names, input_dtypes)]
        params += [f"device {_DTYPES[d][0]}* {n}" for n, d in zip(spec.output_names, output_dtypes)]
        params.append("const uint3 thread_position_in_grid")
        call_args = [f"(const {_DTYPES[d][0]}*)in[{i}]" for i, d in enumerate(input_dtypes)]
        call_args += [f"({_DTYPES[d][0]}*)out[{i}]" for i, d in enumerate(output_dtypes)]
        lines = ['#include "metal_shim.h"']
        lines += [f'#include "{path}"' for path in spec.header_paths()]
        lines += [_template_line(name, value) for name, value in template]
        lines.append(f"static void {spec.name}_thread(" + ", ".join(params) + ") {")
        lines.append(f'#include "{spec.body_path()}"')
        lines.append("}")
        lines.append(f"#define NUM_INPUTS {len(input_dtypes)}")
        lines.append(f"#define NUM_OUTPUTS {len(output_dtypes)}")
        lines.append(
            f"#define LAUNCH_ONE_THREAD(t) {spec.name}_thread(" + ", ".join(call_args + ["t"]) + ")"
        )
        return "\n".join(lines) + "\n" + _MAIN

    def _build(self, source: str) -> Path:
        texts = [source, (SHIM_DIR / "metal_shim.h").read_text(), *_COMPILE_FLAGS]
        texts += [Path(p).read_text() for p in (*self.spec.header_paths(), self.spec.body_path())]
        digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
        exe = self.cache_dir / f"{self.spec.name}_{digest}"
        if exe.exists():
            return exe
        src = self.cache_dir / f"{self.spec.name}_{digest}.cpp"
        src.write_text(source)
        cxx = os.environ.get("CXX", "g++")
        cmd = [cxx, *_COMPILE_FLAGS, f"-I{SHIM_DIR}", str(src), "-o", str(exe) + ".tmp"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"compiling {self.spec.body_path()} as C++ failed:\n{result.stderr}")
        os.replace(str(exe) + ".tmp", exe)
        return exe

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, template=(), threadgroup=None,
                 order: str = "forward", seed: int = 0, sentinel: int = 0xCD, **_ignored):
        arrays = [_to_numpy(a) for a in inputs]
        input_dtypes = [_dtype_name(a.dtype) for a in inputs]
        out_dtype_names = [_dtype_name(d) for d in output_dtypes]
        exe = self._build(self._source(input_dtypes, out_dtype_names, list(template)))
        with tempfile.TemporaryDirectory(prefix="inkling_metal_run_") as work:
            for i, a in enumerate(arrays):
                a.tofile(os.path.join(work, f"in_{i}.bin"))
            out_np_dtypes = [np.dtype(_DTYPES[d][1]) for d in out_dtype_names]
            out_bytes = [int(np.prod(s, dtype=np.int64)) * dt.itemsize
                         for s, dt in zip(output_shapes, out_np_dtypes)]
            env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
                       UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
            cmd = [str(exe), work, *map(str, grid), order, str(seed), str(sentinel), *map(str, out_bytes)]
            result = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if result.returncode != 0:
                raise RuntimeError(
                    f"{self.spec.name} failed on the CPU (exit {result.returncode}):\n{result.stderr[-4000:]}"
                )
            return [
                np.fromfile(os.path.join(work, f"out_{i}.bin"), dtype=dt).reshape(shape)
                for i, (shape, dt) in enumerate(zip(output_shapes, out_np_dtypes))
            ]

    def checked_call(self, **launch):
        """Run twice (forward order / sentinel 0xCD, shuffled order / sentinel 0x5A) and require identical
        outputs: an element no thread writes, or a result that depends on thread order, fails here."""
        first = self(**launch, order="forward", sentinel=0xCD)
        second = self(**launch, order="shuffle", seed=1234, sentinel=0x5A)
        for name, a, b in zip(self.spec.output_names, first, second):
            if a.tobytes() != b.tobytes():
                differing = int(np.count_nonzero(a.view(np.uint8) != b.view(np.uint8)))
                raise AssertionError(
                    f"{self.spec.name}: output {name!r} differs between thread orders/sentinels in "
                    f"{differing} bytes (unwritten elements or an order-dependent result)"
                )
        return first

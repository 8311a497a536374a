// Stand-ins for the Metal built-ins the Inkling kernels use, so that the kernel bodies under
// sglang_inkling_backend/mlx/metal/ compile as C++17 with g++ and run on a Linux CPU.
//
// What this models: address-space qualifiers (device/thread/constant drop out), uint/uchar/uint3,
// as_type<> (a bit copy), bfloat16_t (round-to-nearest-even from float), half (_Float16), and the
// metal:: / metal::precise:: / metal::fast:: math the kernels call (mapped onto <cmath> in fp32).
// What it deliberately leaves undefined, so that a kernel using it fails to compile here rather than
// pass untested: `threadgroup` memory, threadgroup_barrier, simd_* functions, atomics.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#define device
#define thread
#define constant const

using uint = unsigned int;
using uchar = unsigned char;
using ushort = unsigned short;

struct uint3 {
    uint x, y, z;
};

template <typename To, typename From>
inline To as_type(From value) {
    static_assert(sizeof(To) == sizeof(From), "as_type needs types of the same size");
    To out;
    std::memcpy(&out, &value, sizeof(out));
    return out;
}

// bfloat16 as MLX's Metal bfloat16_t behaves: float -> bf16 rounds to nearest even, bf16 -> float exact.
struct bfloat16_t {
    uint16_t bits;
    bfloat16_t() = default;
    bfloat16_t(float value) {
        uint32_t b = as_type<uint32_t>(value);
        if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
            bits = 0x7FC0u;  // quiet NaN
        } else {
            bits = uint16_t((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
        }
    }
    operator float() const { return as_type<float>(uint32_t(bits) << 16); }
};
static_assert(sizeof(bfloat16_t) == 2, "bfloat16_t must be 2 bytes");

using half = _Float16;
using float16_t = _Float16;

namespace metal {
inline float max(float a, float b) { return std::fmax(a, b); }
inline float min(float a, float b) { return std::fmin(a, b); }
inline int max(int a, int b) { return std::max(a, b); }
inline int min(int a, int b) { return std::min(a, b); }
inline uint max(uint a, uint b) { return std::max(a, b); }
inline uint min(uint a, uint b) { return std::min(a, b); }
inline float clamp(float x, float lo, float hi) { return std::fmin(std::fmax(x, lo), hi); }
inline float fabs(float x) { return std::fabs(x); }
inline float rint(float x) { return std::nearbyint(x); }  // default rounding mode: ties to even
inline float exp(float x) { return std::exp(x); }
inline float exp2(float x) { return std::exp2(x); }
inline float tanh(float x) { return std::tanh(x); }
inline float cos(float x) { return std::cos(x); }
inline float sin(float x) { return std::sin(x); }
namespace precise {
inline float cos(float x) { return std::cos(x); }
inline float sin(float x) { return std::sin(x); }
inline float exp(float x) { return std::exp(x); }
inline float tanh(float x) { return std::tanh(x); }
}  // namespace precise
namespace fast {
inline float cos(float x) { return std::cos(x); }
inline float sin(float x) { return std::sin(x); }
inline float exp(float x) { return std::exp(x); }
}  // namespace fast
}  // namespace metal

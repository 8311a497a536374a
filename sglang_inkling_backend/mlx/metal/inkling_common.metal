// Helpers shared by the Inkling Metal kernels (passed to mx.fast.metal_kernel as `header`).
//
// Written in the subset of the Metal Shading Language that also compiles as C++17 under
// tools/check_metal_on_cpu/metal_shim.h, so that the very same text runs on Linux against the
// torch reference. Rules that keep it so: qualify every Metal function with `metal::`, no
// threadgroup memory, no simdgroup functions, no program-scope `constant` variables.
//
// MXFP8 (SGLang's Inkling recipe, identical to sglang_inkling_backend.mxfp8):
//   32 channels share one UE8M0 scale byte e (value 2^(e-127));
//   e = clamp(ceil(log2(max(amax, 1e-30) / 448)) + 127, 0, 254), computed exactly from the bits;
//   data = e4m3fn(x / 2^(e-127)), round-to-nearest-even, saturating at +-448 (and x at +-1.875 * 2^127);
//   a block holding a NaN or an infinity gets scale 0xFF (UE8M0 NaN) and data 0x7F (e4m3 NaN).

#define INKLING_MX_BLOCK 32u

// Smallest e with amax <= 448 * 2^(e - 127). 448 = 1.75 * 2^8, so for amax = m * 2^E (m in [1, 2)):
// e = E + 119 if m <= 1.75 else E + 120. Bits, not log2: log2 of an exact power of two must not round.
inline uint inkling_ue8m0_exponent(float amax) {
    amax = metal::max(amax, 1e-30f);  // an all-zero block gets e = 19, as in SGLang
    const uint bits = as_type<uint>(amax);
    const uint biased = (bits >> 23) & 0xFFu;          // E + 127 (amax >= 1e-30 is a normal float)
    const uint above_1_75 = (bits & 0x7FFFFFu) > 0x600000u ? 1u : 0u;
    return metal::min(biased - 8u + above_1_75, 254u);
}

// 2^(127 - e) as a float, exact for the exponents the quantizer produces (19 <= e <= 247).
inline float inkling_inverse_scale(uint e) {
    return as_type<float>((254u - e) << 23);
}

// mxfp8.LARGEST_ROUND_TRIP = 1.875 * 2^127: a larger finite value would round to 2^128, which float reads as inf.
inline float inkling_saturate(float x) {
    return metal::clamp(x, -as_type<float>(0x7F700000u), as_type<float>(0x7F700000u));
}

#define INKLING_FLOAT_NAN_BITS 0x7FC00000u
#define INKLING_UE8M0_NAN 0xFFu
#define INKLING_E4M3_NAN 0x7Fu

inline bool inkling_is_finite(float x) {
    return (as_type<uint>(x) & 0x7F800000u) != 0x7F800000u;  // bits: safe under any math mode
}

// UE8M0 byte -> 2^(e - 127). e = 0 is the subnormal 2^-127 (never produced by the quantizer); 0xFF is NaN.
inline float inkling_ue8m0_to_float(uint e) {
    if (e == INKLING_UE8M0_NAN) {
        return as_type<float>(INKLING_FLOAT_NAN_BITS);
    }
    return e == 0u ? as_type<float>(0x00400000u) : as_type<float>(e << 23);
}

// Finite float -> e4m3fn byte, round-to-nearest-even, saturating at 448. Integer bit operations only, so
// the result does not depend on how a compiler or interpreter casts to fp8.
inline uchar inkling_e4m3_encode(float x) {
    const uint bits = as_type<uint>(x);
    const uint sign = (bits >> 24) & 0x80u;
    const uint magnitude = bits & 0x7FFFFFFFu;
    uint code;
    if (magnitude >= 0x3C800000u) {                    // |x| >= 2^-6: an e4m3 normal
        const uint mantissa = magnitude & 0x7FFFFFu;
        const uint kept = mantissa >> 20;              // top 3 mantissa bits
        const uint rest = mantissa & 0xFFFFFu;
        code = (((magnitude >> 23) - 120u) << 3) | kept; // e4m3 exponent bias 7 = 127 - 120
        if (rest > 0x80000u || (rest == 0x80000u && (kept & 1u) != 0u)) {
            code += 1u;                                // may carry into the exponent: that is correct
        }
        code = metal::min(code, 0x7Eu);                // saturate at 448 (0x7F is NaN)
    } else {                                           // subnormal: multiples of 2^-9
        code = uint(metal::rint(as_type<float>(magnitude) * 512.0f)); // rint: ties to even; 8 -> 2^-6
    }
    return uchar(sign | code);
}

// e4m3fn byte -> float (exact); 0x7F / 0xFF are NaN.
inline float inkling_e4m3_decode(uint code) {
    if ((code & 0x7Fu) == INKLING_E4M3_NAN) {
        return as_type<float>(INKLING_FLOAT_NAN_BITS);
    }
    const uint sign = (code & 0x80u) << 24;
    const uint exponent = (code >> 3) & 0xFu;
    const uint mantissa = code & 0x7u;
    const float magnitude = exponent == 0u
        ? float(mantissa) * 0.001953125f                              // mantissa * 2^-9
        : as_type<float>(((exponent + 120u) << 23) | (mantissa << 20));
    return as_type<float>(as_type<uint>(magnitude) | sign);
}

// The core's ScaleLayout (sglang_inkling_backend/scale_layout.py: INTERLEAVED_PAGE_SIZE, ROWS_PER_ATOM).
#define INKLING_INTERLEAVED_PAGE_SIZE 128u
#define INKLING_SCALE_ATOM_ROWS 32u

// Offset of the scale byte of (slot, kv head, 32-channel block) in the pool's scale buffer, the one Metal
// spelling of ScaleLayout.flat_index (every kernel that reads or writes pool scales calls it;
// tests/test_scale_offset_agreement.py checks it against the Python and MLX-ops versions): interleaved
// [pages, Hkv, 32, page/32, D/32] when PAGE_SIZE == 128, flat [slots, Hkv, D/32] otherwise.
template <int PAGE_SIZE, int NUM_KV_HEADS, int NUM_BLOCKS>
inline uint inkling_scale_offset(uint slot, uint kv_head, uint block) {
    if (uint(PAGE_SIZE) != INKLING_INTERLEAVED_PAGE_SIZE) {
        return (slot * uint(NUM_KV_HEADS) + kv_head) * uint(NUM_BLOCKS) + block;
    }
    const uint page = slot / uint(PAGE_SIZE);
    const uint in_page = slot % uint(PAGE_SIZE);
    const uint columns = uint(PAGE_SIZE) / INKLING_SCALE_ATOM_ROWS;
    const uint row = (page * uint(NUM_KV_HEADS) + kv_head) * INKLING_SCALE_ATOM_ROWS
        + in_page % INKLING_SCALE_ATOM_ROWS;
    return (row * columns + in_page / INKLING_SCALE_ATOM_ROWS) * uint(NUM_BLOCKS) + block;
}

// Half-split (NeoX) rotation of one head row in fp32, rounded back to T:
// out[i] = x1 cos - x2 sin, out[i + D/2] = x1 sin + x2 cos, theta = position * inv_freq[i].
template <typename T, int HEAD_DIM>
inline void inkling_rope_row(const device T* x, device T* out, float position,
                             const device float* inv_freq) {
    for (uint i = 0; i < uint(HEAD_DIM) / 2u; ++i) {
        const float theta = position * inv_freq[i];
        const float c = metal::precise::cos(theta);   // precise: positions reach 1e5+ radians
        const float s = metal::precise::sin(theta);
        const float x1 = float(x[i]);
        const float x2 = float(x[i + uint(HEAD_DIM) / 2u]);
        out[i] = T(x1 * c - x2 * s);
        out[i + uint(HEAD_DIM) / 2u] = T(x1 * s + x2 * c);
    }
}

// MXFP8-quantize one head row of HEAD_DIM values into HEAD_DIM data bytes and HEAD_DIM/32 scale bytes.
template <typename T, int HEAD_DIM>
inline void inkling_quantize_row(const device T* x, device uchar* data, device uchar* scales) {
    for (uint block = 0; block < uint(HEAD_DIM) / INKLING_MX_BLOCK; ++block) {
        const uint first = block * INKLING_MX_BLOCK;
        float amax = 0.0f;
        bool finite = true;
        for (uint c = 0; c < INKLING_MX_BLOCK; ++c) {
            const float value = float(x[first + c]);
            finite = finite && inkling_is_finite(value);
            amax = inkling_is_finite(value) ? metal::max(amax, metal::fabs(inkling_saturate(value))) : amax;
        }
        if (!finite) {  // the core's choice: the whole block dequantizes to NaN
            for (uint c = 0; c < INKLING_MX_BLOCK; ++c) {
                data[first + c] = uchar(INKLING_E4M3_NAN);
            }
            scales[block] = uchar(INKLING_UE8M0_NAN);
            continue;
        }
        const uint e = inkling_ue8m0_exponent(amax);
        const float inverse_scale = inkling_inverse_scale(e);
        for (uint c = 0; c < INKLING_MX_BLOCK; ++c) {
            const float scaled = metal::clamp(inkling_saturate(float(x[first + c])) * inverse_scale, -448.0f, 448.0f);
            data[first + c] = inkling_e4m3_encode(scaled);
        }
        scales[block] = uchar(e);
    }
}

// Body of the decode attention kernel over an MXFP8 pool (one new query token per request).
// Inputs:  q [B, Hq, D] (T); k_data, v_data [P, Hk, D] uint8 (e4m3fn);
//          k_scales, v_scales uint8 in the core ScaleLayout for PAGE_SIZE (UE8M0);
//          kv_indptr [B + 1] int32; kv_indices [nnz] int32 (pool slots in position order, the new
//          token's key last); params [2] float32 = (softmax_scale, logit_cap; 0 = no cap);
//          sinks [Hq] float32 (read when HAS_SINKS); rel_bias [B, Hq, max(REL_EXTENT, 1)] float32
//          (read when REL_EXTENT > 0: added to the scaled logit at distance i - j < REL_EXTENT, before the cap).
// Output:  out [B, Hq, D] float32.
// Grid: (D / 32, Hq, B). One thread per (32-channel output block, q head, request): it recomputes the
// full logits (D / 32 times redundant) and keeps its own 32 output channels, so threads never share
// memory. Online softmax in fp32. WINDOW > 0 keeps the keys j with 0 <= i - j <= WINDOW - 1.
// Template: T, HEAD_DIM, NUM_QO_HEADS, NUM_KV_HEADS, PAGE_SIZE, WINDOW, HAS_SINKS, REL_EXTENT.
const uint block = thread_position_in_grid.x;
const uint head = thread_position_in_grid.y;
const uint request = thread_position_in_grid.z;
const uint num_blocks = uint(HEAD_DIM) / INKLING_MX_BLOCK;
if (block >= num_blocks || head >= uint(NUM_QO_HEADS)) {
    return;
}
const uint kv_head = head / uint(NUM_QO_HEADS / NUM_KV_HEADS);
const int begin = kv_indptr[request];
const int seq_len = kv_indptr[request + 1] - begin;
const int query_pos = seq_len - 1;
const int first_key = WINDOW > 0 ? metal::max(0, seq_len - int(WINDOW)) : 0;
const float softmax_scale = params[0];
const float logit_cap = params[1];

float query[HEAD_DIM];
for (uint c = 0; c < uint(HEAD_DIM); ++c) {
    query[c] = float(q[(request * uint(NUM_QO_HEADS) + head) * uint(HEAD_DIM) + c]);
}
float acc[INKLING_MX_BLOCK];
for (uint c = 0; c < INKLING_MX_BLOCK; ++c) {
    acc[c] = 0.0f;
}
float running_max = as_type<float>(0xFF800000u);  // -inf
float denom = 0.0f;

for (int j = first_key; j < seq_len; ++j) {
    const uint slot = uint(kv_indices[begin + j]);
    const uint row = (slot * uint(NUM_KV_HEADS) + kv_head) * uint(HEAD_DIM);
    float dot = 0.0f;
    for (uint kb = 0; kb < num_blocks; ++kb) {
        const float k_scale = inkling_ue8m0_to_float(
            k_scales[inkling_scale_offset<PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM / 32>(slot, kv_head, kb)]);
        for (uint c = kb * INKLING_MX_BLOCK; c < (kb + 1u) * INKLING_MX_BLOCK; ++c) {
            dot += query[c] * (inkling_e4m3_decode(k_data[row + c]) * k_scale);
        }
    }
    float logit = dot * softmax_scale;
    const int distance = query_pos - j;
    if (REL_EXTENT > 0 && distance < int(REL_EXTENT)) {
        logit += rel_bias[(request * uint(NUM_QO_HEADS) + head) * uint(REL_EXTENT) + uint(distance)];
    }
    if (logit_cap > 0.0f) {  // the cap applies after the relative bias, as in the reference
        logit = logit_cap * metal::precise::tanh(logit / logit_cap);
    }
    const float new_max = metal::max(running_max, logit);
    const float correction = metal::exp(running_max - new_max);  // exp(-inf) = 0 on the first key
    const float weight = metal::exp(logit - new_max);
    denom = denom * correction + weight;
    const float v_scale = inkling_ue8m0_to_float(
        v_scales[inkling_scale_offset<PAGE_SIZE, NUM_KV_HEADS, HEAD_DIM / 32>(slot, kv_head, block)]);
    for (uint c = 0; c < INKLING_MX_BLOCK; ++c) {
        const float value = inkling_e4m3_decode(v_data[row + block * INKLING_MX_BLOCK + c]) * v_scale;
        acc[c] = acc[c] * correction + weight * value;
    }
    running_max = new_max;
}
if (HAS_SINKS) {
    // The sink is one more logit in the softmax denominator with no value.
    const float sink = sinks[head];
    const float new_max = metal::max(running_max, sink);
    const float correction = metal::exp(running_max - new_max);
    denom = denom * correction + metal::exp(sink - new_max);
    for (uint c = 0; c < INKLING_MX_BLOCK; ++c) {
        acc[c] *= correction;
    }
}
const float inverse_denom = denom > 0.0f ? 1.0f / denom : 0.0f;
for (uint c = 0; c < INKLING_MX_BLOCK; ++c) {
    out[(request * uint(NUM_QO_HEADS) + head) * uint(HEAD_DIM) + block * INKLING_MX_BLOCK + c] =
        acc[c] * inverse_denom;
}

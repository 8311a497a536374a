// Body of the fused RoPE + MXFP8 quantization kernel for an MXFP8 pool.
// Inputs:  q [T, Hq, D] (T), k [T, Hk, D] (T), v [T, Hk, D] (T), positions [T] int32,
//          inv_freq [D/2] float32.
// Outputs: q_rot [T, Hq, D] (T), k_rot [T, Hk, D] (T),
//          k_data [T, Hk, D] uint8 (e4m3 of k_rot as rounded to T), k_scales [T, Hk, D/32] uint8,
//          v_data [T, Hk, D] uint8 (e4m3 of v, not rotated),    v_scales [T, Hk, D/32] uint8.
// Grid: (Hq + 2 * Hk, T, 1): rows [0, Hq) rotate q, [Hq, Hq + Hk) rotate and quantize k,
// [Hq + Hk, Hq + 2 Hk) quantize v. The pool scatter of the quantized rows follows as an MLX scatter.
// Template: T, HEAD_DIM, NUM_QO_HEADS, NUM_KV_HEADS.
const uint row = thread_position_in_grid.x;
const uint token = thread_position_in_grid.y;
if (row >= uint(NUM_QO_HEADS + 2 * NUM_KV_HEADS)) {
    return;
}
const float position = float(positions[token]);
if (row < uint(NUM_QO_HEADS)) {
    const uint offset = (token * uint(NUM_QO_HEADS) + row) * uint(HEAD_DIM);
    inkling_rope_row<T, HEAD_DIM>(q + offset, q_rot + offset, position, inv_freq);
    return;
}
const uint kv_row = row - uint(NUM_QO_HEADS);
const uint kv_head = kv_row % uint(NUM_KV_HEADS);
const uint offset = (token * uint(NUM_KV_HEADS) + kv_head) * uint(HEAD_DIM);
const uint scale_offset = (token * uint(NUM_KV_HEADS) + kv_head) * (uint(HEAD_DIM) / INKLING_MX_BLOCK);
if (kv_row < uint(NUM_KV_HEADS)) {
    inkling_rope_row<T, HEAD_DIM>(k + offset, k_rot + offset, position, inv_freq);
    // Quantize what the float path would store: k_rot as rounded to T (this thread's own writes).
    inkling_quantize_row<T, HEAD_DIM>(k_rot + offset, k_data + offset, k_scales + scale_offset);
} else {
    inkling_quantize_row<T, HEAD_DIM>(v + offset, v_data + offset, v_scales + scale_offset);
}

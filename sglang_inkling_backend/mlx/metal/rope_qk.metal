// Body of the fused RoPE kernel for a float (bf16/f16/f32) pool: rotates q and k of the new tokens.
// Inputs:  q [T, Hq, D] (T), k [T, Hk, D] (T), positions [T] int32, inv_freq [D/2] float32.
// Outputs: q_rot [T, Hq, D], k_rot [T, Hk, D].
// Grid: (Hq + Hk, T, 1), one thread per (head row, token). The pool scatter of k_rot and v follows
// as an MLX scatter (mx.fast.metal_kernel cannot alias an output onto the pool buffer).
// Template: T, HEAD_DIM, NUM_QO_HEADS, NUM_KV_HEADS.
const uint row = thread_position_in_grid.x;
const uint token = thread_position_in_grid.y;
if (row >= uint(NUM_QO_HEADS + NUM_KV_HEADS)) {
    return;
}
const float position = float(positions[token]);
if (row < uint(NUM_QO_HEADS)) {
    const uint offset = (token * uint(NUM_QO_HEADS) + row) * uint(HEAD_DIM);
    inkling_rope_row<T, HEAD_DIM>(q + offset, q_rot + offset, position, inv_freq);
} else {
    const uint offset = (token * uint(NUM_KV_HEADS) + (row - uint(NUM_QO_HEADS))) * uint(HEAD_DIM);
    inkling_rope_row<T, HEAD_DIM>(k + offset, k_rot + offset, position, inv_freq);
}

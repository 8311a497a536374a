
}  // namespace attention
}  // namespace hpc

TORCH_LIBRARY(hpc_dec, m) {
  m.def(
      "attention_decode_fp8(Tensor q, Tensor! kcache, Tensor! vcache, Tensor block_ids, Tensor "
      "num_seq_kvcache, Tensor qscale, Tensor kscale, Tensor vscale, int mtp, bool "
      "new_kv_included, int quant_type, bool "
      "use_splitk, Tensor? task_map, Tensor? split_flag, Tensor? output) -> (Tensor)");
  m.impl("attention_decode_fp8", torch::kCUDA, &hpc::attention::attention_decode_fp8_entry);

  m.def(
      "assign_attention_decode_task(Tensor num_seq_kvcache, int num_head_kv, int num_seq_q, bool "
      "new_kv_included, int min_process_len, Tensor? task_map) -> (Tensor)");
  m.impl("assign_attention_decode_task", torch::kCPU,
         &hpc::attention::assign_attention_decode_task_cpu_entry);
  m.impl("assign_attention_decode_task", torch::kCUDA,
         &hpc::attention::assign_attention_decode_task_cuda_entry);
}

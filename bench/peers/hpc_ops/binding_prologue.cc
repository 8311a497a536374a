// Minimal torch binding for Tencent/hpc-ops SM90 fp8 paged decode attention.
// make_bundle.sh appends hpc-ops@6e2eced src/attention/entry.cc lines 569-817 (its fp8 decode entry points, with
// at::cuda::getCurrentCUDAStream replaced by the getter below) to this file, then binding_epilogue.cc; this part holds a local fp8-only dispatcher replacing src/attention/decode/decode.cc so that the
// bf16 and prefill kernels need not be compiled. Ops are registered as torch.ops.hpc_dec.*
// ATen/cuda/CUDAContext.h replaced: it needs cusparse.h / CUDA-build-only c10 headers. Only the
// current-stream getter is used, which we obtain via the device-generic c10 guard interface.
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <cuda_runtime_api.h>
#include <torch/all.h>
#include <torch/library.h>

#include <iostream>

#include "src/attention/decode/decode.h"
#include "src/attention/decode/smallm_dim128.h"
#include "src/utils/utils.h"

namespace hpc_dec_detail {
struct CurrentStream {
  cudaStream_t s;
  operator cudaStream_t() const { return s; }  // NOLINT
};
inline CurrentStream getCurrentCUDAStream(c10::DeviceIndex idx) {
  auto *impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  c10::Stream st = impl->getStream(c10::Device(c10::DeviceType::CUDA, idx));
  return CurrentStream{reinterpret_cast<cudaStream_t>(st.native_handle())};
}
}  // namespace hpc_dec_detail

namespace hpc {
namespace attention {
namespace decode {
// Same signature/semantics as decode.cc:attention_decode_fp8_async, fp8 paths only.
bool attention_decode_fp8_async(
    void *y_ptr, void *lse_ptr, void *split_out_ptr, const int *task_map_ptr, const void *q_ptr,
    void *kcache_ptr, void *vcache_ptr, const int *block_ids_ptr, const int *num_seq_kvcache_ptr,
    const float *qscale_ptr, const float *kscale_ptr, const float *vscale_ptr, int *split_flag_ptr,
    bool new_kv_included, int splitk, int splitk_min_len, int consumers, int quant_type,
    int num_batch, int num_seq_q, int num_head_q, int num_head_k, int num_head_v, int num_dim_qk,
    int num_dim_v, int num_kvcache_blocks, int block_size, int num_seq_max_blocks,
    int qscale_pad_stride, int ldY, int ldQ, int64_t kcache_block_stride,
    int64_t kcache_token_stride, int64_t kcache_head_stride, int64_t vcache_block_stride,
    int64_t vcache_token_stride, int64_t vcache_head_stride, cudaStream_t stream) {
  if (num_dim_qk != 128) return false;
#define HPC_DEC_ARGS                                                                            \
  y_ptr, lse_ptr, split_out_ptr, task_map_ptr, q_ptr, kcache_ptr, vcache_ptr, block_ids_ptr,    \
      num_seq_kvcache_ptr, qscale_ptr, kscale_ptr, vscale_ptr, split_flag_ptr, new_kv_included, \
      splitk, splitk_min_len, consumers, num_batch, num_seq_q, num_head_q, num_head_k,          \
      num_head_v, num_dim_qk, num_dim_v, num_kvcache_blocks, block_size, num_seq_max_blocks,    \
      qscale_pad_stride, ldY, ldQ, kcache_block_stride, kcache_token_stride,                    \
      kcache_head_stride, vcache_block_stride, vcache_token_stride, vcache_head_stride, stream
  if (quant_type == 1) {
#ifndef HPC_DEC_NO_DYNAMIC
    if (task_map_ptr) return smallm_fp8_qpertoken_perhead_kvpertensor_dim128_dynamic_async(HPC_DEC_ARGS);
#endif
#ifndef HPC_DEC_NO_STATIC
    if (!task_map_ptr) return smallm_fp8_qpertoken_perhead_kvpertensor_dim128_static_async(HPC_DEC_ARGS);
#endif
  }
#ifdef HPC_DEC_WITH_QKPERTOKEN
  if (quant_type == 0) {
    if (task_map_ptr) return smallm_fp8_qkpertoken_perhead_vperhead_dim128_dynamic_async(HPC_DEC_ARGS);
    return smallm_fp8_qkpertoken_perhead_vperhead_dim128_static_async(HPC_DEC_ARGS);
  }
#endif
#undef HPC_DEC_ARGS
  std::cout << "hpc_dec: unsupported quant_type/path " << quant_type << std::endl;
  return false;
}
}  // namespace decode


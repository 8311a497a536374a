"""Test-only import stand-in for FlashMLA (not carried to the GPU machine): SGLang 0.5.23's EAGLE worker imports
``FlashMLABackend`` when it captures its draft CUDA graphs (speculative/eagle_worker_v2.py, _capture_cuda_graphs),
only to list the backend types it supports, and that module imports ``flash_mla`` at its top. No MLA model runs
here: every function raises ``NotImplementedError`` naming itself if called.

Never shipped: this folder lives under gpu_tests/ and is put on PYTHONPATH by gpu_tests/sglang/gpu_env.sh.
"""


def _unavailable(name):
    def call(*args, **kwargs):
        raise NotImplementedError(f"flash_mla stand-in: {name} needs the real FlashMLA package")
    call.__name__ = name
    return call


fused_norm_rope_attn_rope_cast = _unavailable("fused_norm_rope_attn_rope_cast")
get_mla_metadata = _unavailable("get_mla_metadata")
get_mla_decoding_metadata = _unavailable("get_mla_decoding_metadata")
flash_mla_with_kvcache = _unavailable("flash_mla_with_kvcache")
flash_mla_sparse_fwd = _unavailable("flash_mla_sparse_fwd")

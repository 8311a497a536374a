# Source on the GPU machine from the carried .h16/ folder: unpack the carried site-packages, set the environment
# the real SGLang server needs there (the test-only sgl_kernel / IPython stand-ins first on PYTHONPATH).
#   cd .h16 && . gpu_tests/sglang/gpu_env.sh
H16=$(pwd)
if [ ! -d /tmp/site/sglang ]; then
  tar -xJf ../.gpu/sglang_site.tar.xz -C /tmp || { echo "unpacking ../.gpu/sglang_site.tar.xz failed"; return 1; }
fi
export PYTHONPATH=$H16/gpu_tests/sglang/patches:$H16/gpu_tests/sglang/pythonpath:/tmp/site
# INKLING_FROM_SOURCE=1: this project's code from the carried source tree instead of the bundle's wheel (the
# bundle's dist-info still names the entry point; the package, entry_points/ inside it, goes first on the path),
# so a run measures the code it was carried with.
if [ "${INKLING_FROM_SOURCE:-0}" = 1 ]; then
  rm -rf /tmp/inkling_src && mkdir -p /tmp/inkling_src
  cp -r "$H16/sglang_inkling_backend" /tmp/inkling_src/
  export PYTHONPATH=$H16/gpu_tests/sglang/patches:$H16/gpu_tests/sglang/pythonpath:/tmp/inkling_src:/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# The stand-in is no sglang-kernel distribution: skip SGLang's package-version assert for it.
export SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1
export INKLING_TEST_SGL_KERNEL_LOG=${OUT:-/tmp}/sgl_kernel_calls.txt
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The CuTe-DSL dual GEMM needs nvidia-cutlass-dsl (not carried): Llama's MLP takes the plain path (sitecustomize.py).
export INKLING_TEST_NO_DUAL_GEMM=1
# The FA4 package's __init__ needs it too; the Inkling model imports a pure-Python flag from that package.
export INKLING_TEST_NO_CUTE_INIT=1
# Inkling's chat adapter needs tml-renderers and its o200k tokenizer; the harness sends no chat (sitecustomize.py).
export INKLING_TEST_NO_INKLING_CHAT=1
# SGLang 0.5.23's bundled Rust radix-tree core is built for its torch pin (2.14.1); on torch 2.11 its insert reads
# int64 values as Int8 ("ValueError: insert value must be an int64 tensor, got Int8"): use its Python tree core.
export SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python

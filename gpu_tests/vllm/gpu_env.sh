# Source on the GPU machine from the repository root: unpack the carried vLLM bundle (.vgpu) and FlashInfer (.fi072),
# append the bundle after the image's site-packages (a .pth file: the image's own packages win where both have one),
# put FlashInfer, this project's source (INKLING_FROM_SOURCE=1, the default here) and the test patches first.
#   . gpu_tests/vllm/gpu_env.sh
ROOT=$(pwd)
if [ ! -d /tmp/vsite/vllm ]; then
  tar -xJf .vgpu/vllm_site.tar.xz -C /tmp || { echo "unpacking .vgpu/vllm_site.tar.xz failed"; return 1; }
fi
# The bundle carries neither FlashAttention extension (_vllm_fa2_C, _vllm_fa3_C). On CUDA, Llama's and Gemma-3's
# modules import vllm_flash_attn (through fa_utils), whose __init__ refuses to import without one; lift that refusal.
# Its is_fa_version_supported() still answers False, so vLLM never selects FLASH_ATTN here.
sed -i 's/^if not (FA2_AVAILABLE or FA3_AVAILABLE):$/if False and not (FA2_AVAILABLE or FA3_AVAILABLE):/' \
  /tmp/vsite/vllm/vllm_flash_attn/__init__.py
grep -q "^if False and not (FA2_AVAILABLE" /tmp/vsite/vllm/vllm_flash_attn/__init__.py \
  || { echo "gpu_env.sh: vllm_flash_attn's import guard not found"; return 1; }
if [ ! -d /tmp/fi_site/flashinfer ]; then
  mkdir -p /tmp/fi_site && tar -xJf .fi072/*.tar.xz -C /tmp/fi_site || { echo "unpacking .fi072 failed"; return 1; }
fi
SITE_PACKAGES=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo /tmp/vsite > "$SITE_PACKAGES/zz-inkling-vllm-bundle.pth"
rm -rf /tmp/inkling_src && mkdir -p /tmp/inkling_src
# INKLING_SRC: where this project's source comes from (default: the carried checkout; a snapshot such as
# `git archive HEAD sglang_inkling_backend | tar -x -C .vsrc` runs a commit while the tree changes)
SRC=${INKLING_SRC:-$ROOT}
cp -r "$SRC/sglang_inkling_backend" /tmp/inkling_src/
if [ "${INKLING_FROM_SOURCE:-1}" = 1 ]; then
  export PYTHONPATH=$ROOT/gpu_tests/vllm/patches:/tmp/inkling_src:/tmp/fi_site
else
  export PYTHONPATH=$ROOT/gpu_tests/vllm/patches:/tmp/fi_site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export FLASHINFER_WORKSPACE_BASE=$ROOT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The packages the bundle leaves to the image (make_bundle.IMAGE_PACKAGES): named here if the image has lost one
IMAGE_MISSING=$(python3 - $(python3 gpu_tests/vllm/make_bundle.py --print-image-packages) <<'PY'
import importlib.metadata, sys
missing = []
for name in sys.argv[1:]:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        missing.append(name)
print(" ".join(missing))
PY
)
[ -z "$IMAGE_MISSING" ] \
  || echo "gpu_env.sh: the image lacks $IMAGE_MISSING, which the vLLM bundle expects of it (make_bundle.IMAGE_PACKAGES)"

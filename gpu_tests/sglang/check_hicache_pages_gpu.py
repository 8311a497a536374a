"""GPU check (issue #35): SGLang 0.5.23's hierarchical-cache host pool moves this backend's MXFP8 pages to host
memory and back byte for byte, scales included, with its own CUDA transfer kernels (io_backend "kernel", the
page_first layout: what ``--enable-hierarchical-cache`` runs). The CPU test
``tests/hosts/sglang/test_sglang_hicache_host_pool.py`` does the same move with torch indexing; this one runs
SGLang's ``MHATokenToKVPoolMXFP8Host``, built as SGLang builds it (``hybrid_pool_assembler._mha_host_inputs``).

Checks, on a pool of 2 layers, 2 KV heads, head_dim 128, page 128: 4 pages of random K/V (each token's values scaled
by a different power of ten, so every page row holds many scale exponents) backed up to the host, loaded into 4
other device pages: payload bytes, scale bytes and dequantized values equal the originals. The control: the same
pages loaded with the payload only (the plain MHA host pool's load, the scale rows left behind) read back other
values, so the comparison can fail. One JSON line per check; exit 1 on a failure.

    cd .h16 && . gpu_tests/sglang/gpu_env.sh && python3 gpu_tests/sglang/check_hicache_pages_gpu.py   # device
"""
from __future__ import annotations

import json
import sys

import torch

HKV, D, PAGE, LAYERS, PAGES = 2, 128, 128, 2, 16


def main() -> int:
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mha_mxfp8 import MHATokenToKVPoolMXFP8Host

    from sglang_inkling_backend.hosts.sglang.pool import inkling_pool_class

    results = []

    def check(name, ok, **info):
        results.append(ok)
        print(json.dumps({"check": name, "ok": bool(ok), **info}), flush=True)

    pool = inkling_pool_class("mxfp8")(PAGES * PAGE, PAGE, torch.float8_e4m3fn, HKV, D, LAYERS, "cuda", False)
    cls, info, kwargs = _mha_host_inputs(pool)
    check("SGLang picks its MXFP8 host pool", cls is MHATokenToKVPoolMXFP8Host, cls=cls.__name__)
    host = cls(info, 2.0, 0, PAGE, "page_first", allocator_type="default", **kwargs)

    g = torch.Generator(device="cuda").manual_seed(5)
    src = torch.arange(1 * PAGE, 5 * PAGE, device="cuda")
    dst = torch.arange(5 * PAGE, 9 * PAGE, device="cuda")
    ctl = torch.arange(9 * PAGE, 13 * PAGE, device="cuda")
    scale = torch.logspace(-4, 4, src.numel(), device="cuda").view(-1, 1, 1)
    for layer in range(LAYERS):
        k = (torch.randn(src.numel(), HKV, D, generator=g, device="cuda") * scale).bfloat16()
        v = (torch.randn(src.numel(), HKV, D, generator=g, device="cuda") * scale).bfloat16()
        pool.set_kv_buffer(None, src, k, v, layer_id_override=layer)

    def raw(layer, slots):
        layout = pool.core.scale_layout(layer)
        sk, sv = pool.core.get_kv_scale_buffer(layer)
        k, v = pool.k_buffer[layer][slots], pool.v_buffer[layer][slots]
        return (k.view(torch.uint8).clone(), v.view(torch.uint8).clone(), layout.gather(sk, slots).clone(),
                layout.gather(sv, slots).clone())

    before = [raw(layer, src) for layer in range(LAYERS)]
    values = [pool.core.read_kv(layer, src) for layer in range(LAYERS)]
    # as SGLang's cache controller passes them (move_indices): host slots on the CPU for the staged write-back, on
    # the device for the loads
    host_slots = host.alloc(src.numel())
    host.backup_from_device_all_layer(pool, host_slots, src, "kernel")
    torch.cuda.synchronize()
    host_slots = host_slots.to("cuda")
    for layer in range(LAYERS):
        host.load_to_device_per_layer(pool, host_slots, dst, layer, "kernel")
    torch.cuda.synchronize()
    for layer in range(LAYERS):
        after = raw(layer, dst)
        names = ("k bytes", "v bytes", "k scale bytes", "v scale bytes")
        for name, a, b in zip(names, before[layer], after):
            check(f"layer {layer}: {name} after the round trip", torch.equal(a, b), bytes=a.numel())
        got = pool.core.read_kv(layer, dst)
        check(f"layer {layer}: dequantized K/V after the round trip",
              all(torch.equal(x, y) for x, y in zip(got, values[layer])))
    # the control: the payload alone (the MHA host pool's own load), the scales left where they were
    for layer in range(LAYERS):
        MHATokenToKVPoolHost.load_to_device_per_layer(host, pool, host_slots, ctl, layer, "kernel")
    torch.cuda.synchronize()
    payload_equal = torch.equal(raw(0, ctl)[0], before[0][0])
    values_equal = torch.equal(pool.core.read_kv(0, ctl)[0], values[0][0])
    check("control: payload without its scales reads other values", payload_equal and not values_equal,
          payload_equal=payload_equal, values_equal=values_equal)
    print(json.dumps({"failed": results.count(False)}))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

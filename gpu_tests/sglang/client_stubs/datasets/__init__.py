"""Stand-in for Hugging Face ``datasets`` on the GPU machine, whose image has none (test-only: serve_bench.py puts
its folder first on the benchmark client's PYTHONPATH, never the server's). In SGLang 0.5.23 ``load_dataset`` is the
one name sglang.benchmark imports from it: ``datasets/mmmu.py`` at module level (so ``sglang.benchmark.datasets``
needs it to import at all), ``datasets/longbench_v2.py`` inside a function. The random-ids and generated-shared-prefix
workloads never call it."""


def load_dataset(*args, **kwargs):
    raise NotImplementedError("datasets.load_dataset: this is serve_bench.py's stand-in "
                              "(gpu_tests/sglang/client_stubs/datasets), not Hugging Face datasets; "
                              "use a workload that needs no downloaded dataset (random-ids, generated-shared-prefix)")

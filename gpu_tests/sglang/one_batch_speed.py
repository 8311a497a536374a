"""Decode step time of the real SGLang 0.5.23 in one process, on SGLang's own one-batch benchmark path (test-only).

No server, no HTTP, no scheduler: the batch is built and stepped the way ``python -m sglang.benchmark.one_batch``
does it, so each timed step is one decode forward of the whole batch (through the decode CUDA-graph runner).

From ``sglang/benchmark/one_batch.py`` (SGLang 0.5.23; there is no ``sglang/bench_one_batch.py`` in 0.5.23):
- ``main(server_args, bench_args)``: resolves the server args, merging ``max(bench_args.batch_size)`` into the decode
  CUDA-graph config (its ``max_bs``), runs ``_set_envs_and_config`` and ``PortArgs.init_new``, then calls the module's
  ``latency_test``; for the call this script puts its own ``run_points`` in that slot (``tp_size`` is 1, so main()
  calls it in this process);
- ``run_points`` starts as ``latency_test`` does (``publish``, ``_init_process_global_configs``, ``configure_logger``)
  and calls ``load_model`` (ModelRunner, ``alloc_memory_pool``, ``init_attention_backends``, ``init_cuda_graphs``;
  it returns the ``_TorchBenchRunner`` wrapper);
- per point: ``prepare_synthetic_inputs_for_latency_test`` (``Req`` objects of random ids in [0, 10000)),
  ``_TorchBenchRunner.clear/extend/decode/synchronize/max_batch_size``: ``extend`` builds one ``ScheduleBatch``
  (``ScheduleBatch.init_new`` + ``prepare_for_extend``, a dummy tree cache, no prefix sharing) and runs
  ``ForwardBatch.init_new`` + ``ModelRunner.forward`` + ``sample``; ``decode`` runs ``prepare_for_decode`` on the same
  batch (one more token per request) and the same forward + sample.

Before that, ``sglang.srt.plugins.load_plugins()`` (what every SGLang server process calls; the one-batch module
does not), so the ``sglang.srt.plugins`` entry point of this project registers ``--attention-backend inkling``. It
logs and swallows plugin exceptions: with ``--attention-backend inkling`` this script then checks
``sglang_inkling_backend.entry_points.sglang.is_registered()`` and raises if not.

Timing: first a warm-up (the first point's batch at context 256, a prefill and a few decode steps: JIT compiles).
Then per point (batch B, context C): the prefill of B requests of C tokens (``prefill_s``: wall, synchronized; the
median of ``--prefill-repeats`` prefills into cleared pools, all in ``prefill_s_all``), in extends of at most
``--prefill-chunk-tokens`` tokens merged into one batch as the scheduler merges a prefilled batch into the running
one (``ScheduleBatch.merge_batch``),
``--warmup-steps`` decode steps, then ``--steps`` timed ones. ``step_ms``: wall time of one ``decode()`` call
between two device synchronizations (as in one_batch's ``latency_test_run_once``: batch preparation, forward,
sampling); ``forward_ms`` (CUDA only): CUDA events on the current stream around ``ModelRunner.forward`` inside
that call (the graph replay and its input copies); ``graph_metadata_us``: the host time of the attention backend's
``init_forward_metadata_out_graph`` (its work before each graph replay, inside ``forward_ms``). Medians are
reported; decode tokens/s = B / median step. With CUDA graphs on, every timed step must have run the decode graph
(``ModelRunnerOutput.can_run_graph``), else the script raises. The KV tokens the pool holds:
``ModelRunner.max_total_num_tokens``. The profiles (``--profile-prefill``, ``--profile-steps``) run after every
point is timed: having run the profiler slows later steps (``profile_point``).

Any error raises (non-zero exit, traceback); the JSON is written with the points done so far and ``error``.

    python3 gpu_tests/sglang/one_batch_speed.py --model /tmp/models/llama-gqa4-l16 --attention-backend inkling \\
        --kv-cache-dtype mxfp8 --points 1x4096,32x4096,128x4096,1x32768,32x32768 --steps 64 --out run.json
    # on a CPU (re-executes itself with the project's CPU shims; CUDA graphs off):
    python gpu_tests/sglang/one_batch_speed.py --device cpu --model /tmp/models/llama-gqa4 \\
        --attention-backend torch_native --points 2x256 --steps 4 --out cpu.json
Extra SGLang server arguments go after ``--``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def parse_points(text: str) -> list[tuple[int, int]]:
    """``"1x4096,32x32768"`` -> ``[(1, 4096), (32, 32768)]`` (batch, context); both positive."""
    points = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() for p in parts) or min(int(p) for p in parts) < 1:
            raise ValueError(f"point {item!r}: expected BATCHxCONTEXT with positive integers, e.g. 32x4096")
        points.append((int(parts[0]), int(parts[1])))
    return points


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--attention-backend", required=True, choices=["inkling", "triton", "flashinfer", "torch_native"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "mxfp8", "fp8_e4m3"])
    ap.add_argument("--points", default="1x4096,32x4096,128x4096,1x32768,32x32768", help="BATCHxCONTEXT,...")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per point")
    ap.add_argument("--warmup-steps", type=int, default=4, help="untimed decode steps per point, before the timed")
    ap.add_argument("--mem-fraction-static", type=float, default=0.3)
    ap.add_argument("--prefill-chunk-tokens", type=int, default=1 << 20,
                    help="prefill a point's requests in extends of at most this many tokens (at least one request "
                         "each), merged into one decode batch: 128 x 32k tokens in one extend would need ~80 GB of "
                         "MLP activations on llama-gqa4-l16")
    ap.add_argument("--prefill-repeats", type=int, default=1,
                    help="prefill each point's batch this many times (the pools cleared in between) and report the "
                         "median: one prefill of 128 x 1k is 0.2 s, and two FlashInfer entries' single samples "
                         "differed by 2.4% (bench/results/current/sglang-h200/speed/call-fused-store-1k/)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--disable-cuda-graph", action="store_true", help="eager decode (always so on --device cpu)")
    ap.add_argument("--seed", type=int, default=1234, help="numpy seed of the random prompt ids")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after every point is timed, per point a prefill and this many decode steps under "
                         "torch.profiler: the CUDA kernels' total time per name (graph replays included) in the "
                         "log and in the point's 'kernels'")
    ap.add_argument("--profile-prefill", action="store_true",
                    help="after every point is timed, per point one more prefill under torch.profiler: its CUDA "
                         "kernels' total time per name in the log and in the point's 'prefill_kernels'")
    ap.add_argument("--cprofile-steps", type=int, default=0,
                    help="after the timed points: this many decode steps and one prefill per point under cProfile "
                         "(the host's Python, per function)")
    ap.add_argument("--label", default=None)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        args.points = parse_points(args.points)
    except ValueError as err:
        ap.error(f"--points: {err}")
    if args.steps < 1 or args.warmup_steps < 0:
        ap.error("--steps must be >= 1 and --warmup-steps >= 0")
    if args.prefill_chunk_tokens < 1:
        ap.error("--prefill-chunk-tokens must be >= 1")
    if args.prefill_repeats < 1:
        ap.error("--prefill-repeats must be >= 1")
    return args, extra


def server_argv(args: argparse.Namespace, extra: list[str]) -> list[str]:
    """SGLang server arguments. The decode graph sizes come from one_batch.main() (max batch of the points)."""
    out = ["--model-path", args.model, "--attention-backend", args.attention_backend,
           "--kv-cache-dtype", args.kv_cache_dtype, "--dtype", "bfloat16",
           "--mem-fraction-static", str(args.mem_fraction_static), "--device", args.device,
           "--max-running-requests", str(max(b for b, _ in args.points))]
    if args.device == "cpu":
        out.append("--disable-cuda-graph")
        if "--max-total-tokens" not in extra:  # on a CPU, size the pool by the work (no memory fraction)
            need = max(b * (c + args.warmup_steps + args.steps + 1) for b, c in args.points)
            out += ["--max-total-tokens", str(2 * need + 1024)]
    elif args.disable_cuda_graph:
        out.append("--disable-cuda-graph")
    return out + extra


def reexec_for_cpu(argv: list[str]) -> None:
    """On a CPU, SGLang needs the project's CPU shims on PYTHONPATH before start-up (their sitecustomize)."""
    sys.path.insert(0, str(REPO))
    from demo.cpu_host import cpu_env

    env = cpu_env()
    env["PYTHONPATH"] = str(HERE / "patches") + os.pathsep + env["PYTHONPATH"]
    env["ONE_BATCH_SPEED_CPU_ENV"] = "1"
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


# The attention backend's methods whose host time ForwardProbe records (every SGLang backend has them)
HOST_TIMED = ("init_forward_metadata", "forward_decode", "forward_extend")


def median(values):
    return statistics.median(values) if values else None


class ForwardProbe:
    """Wraps one ModelRunner's ``forward`` (instance attribute): records, per decode forward, whether it ran the
    decode graph, and (CUDA) a pair of events around it."""

    def __init__(self, runner, cuda: bool):
        import torch

        self.torch, self.cuda, self.original = torch, cuda, runner.forward
        self.graph, self.events, self.metadata_s = [], [], []
        runner.forward = self
        # The attention backend's host work before each decode graph replay (SGLang's graph runner calls
        # init_forward_metadata_out_graph, every backend's), timed on the host: it runs inside forward_ms
        backend = getattr(runner, "attn_backend", None)
        original_metadata = getattr(backend, "init_forward_metadata_out_graph", None)
        if original_metadata is not None:
            def timed_metadata(*args, **kwargs):
                tic = time.perf_counter()
                try:
                    return original_metadata(*args, **kwargs)
                finally:
                    self.metadata_s.append(time.perf_counter() - tic)
            backend.init_forward_metadata_out_graph = timed_metadata

        # Host time of each attention call (the layer's whole call: checks, store, plan lookups, kernel launches;
        # no synchronization, so on a GPU the kernels' own time is not in it) and of the eager metadata, per step
        self.host_s = {name: [] for name in HOST_TIMED}
        for name in HOST_TIMED:
            original = getattr(backend, name, None)
            if original is not None:
                setattr(backend, name, self._host_timed(name, original))

    def _host_timed(self, name, original):
        def timed(*args, **kwargs):
            tic = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.host_s[name].append(time.perf_counter() - tic)
        return timed

    def host_us(self) -> dict:
        """Per timed method: calls and the median host microseconds per call since the last ``reset``."""
        return {name: {"calls": len(s), "median_us": round(1e6 * median(s), 2) if s else None,
                       "max_us": round(1e6 * max(s), 2) if s else None, "total_ms": round(1e3 * sum(s), 3)}
                for name, s in self.host_s.items()}

    def reset(self):
        self.graph, self.events, self.metadata_s = [], [], []
        self.host_s = {name: [] for name in HOST_TIMED}

    def __call__(self, forward_batch, *args, **kwargs):
        decode = forward_batch.forward_mode.is_decode()
        if decode and self.cuda:
            start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            start.record()
        output = self.original(forward_batch, *args, **kwargs)
        if decode:
            self.graph.append(bool(output.can_run_graph))
            if self.cuda:
                end.record()
                self.events.append((start, end))
        return output

    def forward_ms(self):
        return [s.elapsed_time(e) for s, e in self.events]  # after a synchronize


def profiler_activities() -> list:
    """CUDA kernels on a GPU; on a CPU (``--device cpu``), the CPU ops (their self time)."""
    import torch
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]


def profiled_what() -> str:
    import torch

    return "CUDA kernels" if torch.cuda.is_available() else "CPU ops"


def kernel_table(prof, per: int) -> list:
    """[(kernel name, total us / per, calls / per)] of a torch.profiler run, the top 40 by time."""
    import torch

    cuda = torch.cuda.is_available()
    rows = []
    for event in prof.key_averages():
        if cuda:
            total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        else:
            total = event.self_cpu_time_total
        if total:
            rows.append((event.key[:160], total / per, event.count / per))
    rows.sort(key=lambda r: -r[1])
    return rows[:40]


def print_kernels(title: str, rows: list, unit: str) -> None:
    """A ``kernel_table`` in the log, its times in ``unit`` (us or ms)."""
    div = 1e3 if unit == "ms" else 1.0
    print(f"{title}: {sum(r[1] for r in rows) / div:.1f} {unit} in the top {len(rows)}", flush=True)
    for name, us, calls in rows:
        print(f"  {us / div:9.3f} {unit} {calls:6.1f}x  {name}", flush=True)


def profile_steps(bench, next_ids, sched_batch, steps: int) -> tuple[list, object]:
    """``steps`` decode steps under torch.profiler: ``kernel_table`` per step, and the last step's ids."""
    from torch.profiler import profile

    bench.synchronize()
    with profile(activities=profiler_activities()) as prof:
        for _ in range(steps):
            next_ids, _ = bench.decode(next_ids, sched_batch)
        bench.synchronize()
    return kernel_table(prof, steps), next_ids


def profile_prefill(bench, batch: int, context: int, per_chunk: int) -> tuple[list, float]:
    """One untimed prefill of the point under torch.profiler: its ``kernel_table`` and its wall seconds (the
    profiler's own cost included), for what a prefill's time is made of next to the sum of its kernels (on a CPU,
    of its ops)."""
    from torch.profiler import profile

    with profile(activities=profiler_activities()) as prof:
        seconds, _, sched_batch = prefill(bench, batch, context, per_chunk)
    bench.cleanup(sched_batch)
    return kernel_table(prof, 1), seconds


def prefill(bench, batch: int, context: int, per_chunk: int) -> tuple:
    """``(seconds, next token ids, scheduled batch)``: the point's requests prefilled into empty pools, in extends of
    ``per_chunk`` requests merged into one decode batch."""
    import torch
    from sglang.benchmark import one_batch

    bench.clear()
    reqs = one_batch.prepare_synthetic_inputs_for_latency_test(batch, context)
    bench.synchronize()
    tic = time.perf_counter()
    next_ids, _, sched_batch = bench.extend(reqs[:per_chunk])
    for first in range(per_chunk, batch, per_chunk):
        # The scheduler's way of joining a prefilled batch to the running one (Scheduler: running_batch.merge_batch)
        ids, _, part = bench.extend(reqs[first:first + per_chunk])
        sched_batch.merge_batch(part)
        next_ids = torch.cat([next_ids, ids])
    bench.synchronize()
    return time.perf_counter() - tic, next_ids, sched_batch


def time_point(bench, probe, batch: int, context: int, warmup_steps: int, steps: int, graphs_on: bool,
               prefill_chunk_tokens: int, prefill_repeats: int = 1) -> dict:
    decode_steps = warmup_steps + steps
    fits = bench.max_batch_size(context, decode_steps + 1)  # max_total_num_tokens // (context + decode tokens)
    if batch > fits:
        raise RuntimeError(f"B={batch} ctx={context}: the KV pool ({bench.torch_runner.max_total_num_tokens} tokens) "
                           f"holds at most {fits} such requests; raise --mem-fraction-static or shrink the point")
    per_chunk = max(1, prefill_chunk_tokens // context)
    prefill_all = []
    probe.reset()
    for _ in range(prefill_repeats):  # the last one's batch decodes
        seconds, next_ids, sched_batch = prefill(bench, batch, context, per_chunk)
        prefill_all.append(seconds)
    prefill_host = probe.host_us()
    prefill_s = median(prefill_all)
    if len(sched_batch.reqs) != batch or sched_batch.seq_lens.numel() != batch:
        raise RuntimeError(f"B={batch} ctx={context}: the prefilled batch holds {len(sched_batch.reqs)} requests")
    for _ in range(warmup_steps):
        next_ids, _ = bench.decode(next_ids, sched_batch)
    bench.synchronize()
    probe.reset()
    step_s = []
    for _ in range(steps):
        bench.synchronize()
        tic = time.perf_counter()
        next_ids, _ = bench.decode(next_ids, sched_batch)
        bench.synchronize()
        step_s.append(time.perf_counter() - tic)
    if len(probe.graph) != steps:
        raise RuntimeError(f"B={batch} ctx={context}: {len(probe.graph)} decode forwards seen in {steps} decode steps")
    graph_steps = sum(probe.graph)
    if graphs_on and graph_steps != steps:
        captured = getattr(bench.torch_runner.decode_cuda_graph_runner, "capture_bs", None)
        raise RuntimeError(f"B={batch} ctx={context}: only {graph_steps} of {steps} decode steps ran the decode CUDA "
                           f"graph (captured batch sizes: {captured})")
    bench.cleanup(sched_batch)
    step_ms = [1000 * s for s in step_s]
    forward_ms = probe.forward_ms()
    metadata_us = [1e6 * x for x in probe.metadata_s]
    med = median(step_ms)
    return {"batch": batch, "context": context, "prefill_s": prefill_s, "prefill_s_all": prefill_all,
            "prefill_chunks": -(-batch // per_chunk),
            "warmup_steps": warmup_steps, "steps": steps,
            "step_ms": med, "step_ms_min": min(step_ms), "step_ms_max": max(step_ms),
            "forward_ms": median(forward_ms), "decode_tok_s": batch * 1000 / med, "graph_steps": graph_steps,
            "graph_metadata_us": median(metadata_us) if metadata_us else None,
            "decode_host_us": probe.host_us(), "prefill_host_us": prefill_host,
            "kv_tokens_end": batch * (context + decode_steps + 1), "last_step_ids": next_ids.tolist(),
            "step_ms_all": [round(x, 4) for x in step_ms], "kernels": None, "prefill_kernels": None}


ATTENTION_PATHS = ("sglang_inkling_backend", "flashinfer", "/triton/", "layers/attention", "radix_attention")


def python_profile(run, top: int = 30) -> list:
    """``run()`` under cProfile: the ``top`` functions by cumulative time, as [cumulative us, own us, calls, where]
    (the host's Python per step: which of the attention backend's calls cost what)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    try:
        run()
    finally:
        prof.disable()
    stats = pstats.Stats(prof).stats
    rows = [(round(1e6 * ct, 1), round(1e6 * tt, 1), nc, f"{Path(f).name}:{line}({name})", f)
            for (f, line, name), (cc, nc, tt, ct, _) in stats.items()]
    rows.sort(key=lambda r: -r[0])
    # the whole step's top, then the attention backends' own functions (this package's, FlashInfer's, Triton's
    # launcher, SGLang's attention backends), which the step's top would crowd out
    attention = [r for r in rows if any(part in r[4] for part in ATTENTION_PATHS)]
    chosen = rows[:top] + [r for r in attention[:2 * top] if r not in rows[:top]]
    return [r[:4] for r in chosen]


def cprofile_point(bench, point: dict, warmup_steps: int, prefill_chunk_tokens: int, steps: int) -> None:
    """The point's Python under cProfile: one prefill (``prefill_python``) and ``steps`` decode steps
    (``decode_python``), each a ``python_profile`` table, printed and kept in the point."""
    batch, context = point["batch"], point["context"]
    per_chunk = max(1, prefill_chunk_tokens // context)
    held = {}

    def one_prefill():
        held["prefill"] = prefill(bench, batch, context, per_chunk)

    point["prefill_python"] = python_profile(one_prefill)
    _, next_ids, sched_batch = held["prefill"]
    for _ in range(warmup_steps):
        next_ids, _ = bench.decode(next_ids, sched_batch)
    bench.synchronize()

    def decode_steps():
        ids = next_ids
        for _ in range(steps):
            ids, _ = bench.decode(ids, sched_batch)
        bench.synchronize()

    point["decode_python"] = python_profile(decode_steps)
    bench.cleanup(sched_batch)
    for title, rows, per in (("one prefill", point["prefill_python"], 1), (f"{steps} decode steps",
                                                                          point["decode_python"], steps)):
        print(f"B={batch} ctx={context}: Python of {title} (cumulative us / own us per step, calls per step):")
        for cum, own, calls, where in rows:
            print(f"  {cum / per:10.1f} {own / per:9.1f} {calls / per:8.1f}  {where}", flush=True)


def profile_point(bench, point: dict, warmup_steps: int, prefill_chunk_tokens: int, profile: int,
                  profile_prefill_kernels: bool) -> None:
    """The point's kernels under torch.profiler, after every point was timed: a process that has run the profiler
    times later decode steps up to 11% slower (ours bf16 at 128 x 4k and 32 x 32k,
    bench/results/current/sglang-h200/speed/call-profiler-ab/). ``prefill_kernels``: one more prefill;
    ``kernels``: ``profile`` decode steps after a prefill and ``warmup_steps`` untimed ones."""
    batch, context = point["batch"], point["context"]
    per_chunk = max(1, prefill_chunk_tokens // context)
    if profile_prefill_kernels:
        point["prefill_kernels"], seconds = profile_prefill(bench, batch, context, per_chunk)
        print_kernels(f"B={batch} ctx={context}: {profiled_what()} of one prefill ({seconds:.3f} s under the "
                      f"profiler)", point["prefill_kernels"], "ms")
    if profile:
        _, next_ids, sched_batch = prefill(bench, batch, context, per_chunk)
        for _ in range(warmup_steps):
            next_ids, _ = bench.decode(next_ids, sched_batch)
        point["kernels"], _ = profile_steps(bench, next_ids, sched_batch, profile)
        print_kernels(f"B={batch} ctx={context}: {profiled_what()} per decode step ({profile} steps profiled)",
                      point["kernels"], "us")
        bench.cleanup(sched_batch)


def attention_backend_names(runner) -> list[str]:
    """Class names of the runner's attention backend and of the backends it wraps (hybrid backends)."""
    backend = runner.attn_backend
    names = [type(backend).__name__]
    for attr in ("prefill_backend", "decode_backend", "full_attn_backend"):
        inner = getattr(backend, attr, None)
        if inner is not None:
            names.append(f"{attr}={type(inner).__name__}")
    return names


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parse_args(argv)
    if args.device == "cpu" and os.environ.get("ONE_BATCH_SPEED_CPU_ENV") != "1":
        reexec_for_cpu(argv)

    import logging

    import numpy as np
    import torch

    from sglang.srt.plugins import load_plugins

    load_plugins()  # before ServerArgs.add_cli_args: the plugin adds "inkling" to --attention-backend's choices
    if args.attention_backend == "inkling":
        from sglang_inkling_backend.entry_points.sglang import is_registered

        if not is_registered():
            raise RuntimeError("sglang.srt.plugins.load_plugins() did not register --attention-backend inkling "
                               "(see the plugin's ERROR line above)")

    from sglang.benchmark import one_batch
    from sglang.srt.server_args import ServerArgs

    sargv = server_argv(args, extra)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    server_args = ServerArgs.from_cli_args(parser.parse_args(sargv))
    if server_args.tp_size != 1:
        raise ValueError("one process, one GPU: tp_size must be 1")
    bench_args = one_batch.BenchArgs(batch_size=tuple(b for b, _ in args.points),
                                     input_len=tuple(c for _, c in args.points), output_len=(args.steps,))
    logging.basicConfig(level=getattr(logging, server_args.log_level.upper()), format="%(message)s")
    cuda = args.device == "cuda"
    graphs_on = cuda and "--disable-cuda-graph" not in sargv
    label = args.label or f"{args.attention_backend}/{args.kv_cache_dtype}"
    record = {"label": label, "model": Path(args.model).name, "attention_backend": args.attention_backend,
              "kv_cache_dtype": args.kv_cache_dtype, "device": args.device, "cuda_graphs": graphs_on,
              "server_args": sargv, "steps": args.steps, "warmup_steps": args.warmup_steps, "points": []}
    if cuda:
        record["gpu"] = torch.cuda.get_device_name()
    import sglang
    import sglang_inkling_backend

    record.update(torch=torch.__version__, sglang=sglang.__version__,
                  inkling_package=str(Path(sglang_inkling_backend.__file__).parent))

    def run_points(server_args, port_args, bench_args, gpu_id, tp_rank):
        # latency_test's start, then this script's points (see the module docstring).
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank
        from sglang.srt.utils import configure_logger

        publish(server_args, role="scheduler",
                ranks=SpawnRanks(world_rank=spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=0), gpu_id=gpu_id))
        one_batch._init_process_global_configs()
        configure_logger(server_args, prefix=f" TP{tp_rank}")
        t0 = time.perf_counter()
        bench, _tokenizer = one_batch.load_model(server_args, port_args, gpu_id, tp_rank)
        runner = bench.torch_runner
        record["load_s"] = time.perf_counter() - t0
        record["max_total_num_tokens"] = int(runner.max_total_num_tokens)
        record["kv_pool"] = type(runner.token_to_kv_pool).__name__
        record["kv_dtype"] = str(getattr(runner, "kv_cache_dtype", None))
        record["page_size"] = getattr(runner, "page_size", None)
        record["attention_backend_classes"] = attention_backend_names(runner)
        graph_runner = runner.decode_cuda_graph_runner
        record["decode_graph_runner"] = type(graph_runner).__name__ if graph_runner is not None else None
        record["decode_graph_bs"] = list(getattr(graph_runner, "capture_bs", None) or [])
        print(f"{label}: max_total_num_tokens={record['max_total_num_tokens']} kv_pool={record['kv_pool']} "
              f"attention={record['attention_backend_classes']} graph_bs={record['decode_graph_bs']}", flush=True)
        if args.attention_backend == "inkling" and not any("Inkling" in n for n in record["attention_backend_classes"]):
            raise RuntimeError(f"--attention-backend inkling built {record['attention_backend_classes']}")
        if graphs_on and not record["decode_graph_bs"]:
            raise RuntimeError(f"CUDA graphs are on but no decode graph was captured (runner {graph_runner!r})")
        probe = ForwardProbe(runner, cuda)
        np.random.seed(args.seed)
        # Warm-up (JIT compiles, as latency_test warms up): the first point's batch at a short context.
        warm_b, _ = args.points[0]
        time_point(bench, probe, warm_b, 256, args.warmup_steps, 2, graphs_on, args.prefill_chunk_tokens)
        for batch, context in args.points:
            point = time_point(bench, probe, batch, context, args.warmup_steps, args.steps, graphs_on,
                               args.prefill_chunk_tokens, args.prefill_repeats)
            record["points"].append(point)
            fwd = f", forward {point['forward_ms']:.3f} ms" if point["forward_ms"] is not None else ""
            if point["graph_metadata_us"] is not None:
                fwd += f" (graph metadata {point['graph_metadata_us']:.0f} us on the host)"
            print(f"{label} B={batch} ctx={context}: step {point['step_ms']:.3f} ms (min {point['step_ms_min']:.3f}, "
                  f"max {point['step_ms_max']:.3f}){fwd}, {point['decode_tok_s']:.0f} decode tok/s, graph "
                  f"{point['graph_steps']}/{args.steps}, prefill {point['prefill_s']:.2f} s", flush=True)
            print(f"{label} B={batch} ctx={context}: host us per call (median): decode "
                  f"{json.dumps(point['decode_host_us'])}; prefill {json.dumps(point['prefill_host_us'])}", flush=True)
            # Each finished point is on disk at once: a per-entry timeout (SIGTERM, no finally) keeps the points
            # measured before it.
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=1))
        if args.profile_steps or args.profile_prefill:
            for point in record["points"]:
                profile_point(bench, point, args.warmup_steps, args.prefill_chunk_tokens, args.profile_steps,
                              args.profile_prefill)
                args.out.write_text(json.dumps(record, indent=1))
        if args.cprofile_steps:
            for point in record["points"]:
                cprofile_point(bench, point, args.warmup_steps, args.prefill_chunk_tokens, args.cprofile_steps)
                args.out.write_text(json.dumps(record, indent=1))
        record["done"] = True

    original = one_batch.latency_test
    one_batch.latency_test = run_points
    try:
        one_batch.main(server_args, bench_args)
        if not record.get("done"):
            raise RuntimeError("sglang.benchmark.one_batch.main() returned without running this script's points")
    except BaseException as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        one_batch.latency_test = original
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The server finds ``--attention-backend inkling`` through the ``sglang.srt.plugins`` entry point.

The servers are ``python -m sglang.launch_server`` subprocesses that never import this package themselves: the only
way ``inkling`` can be a valid choice there is SGLang's plugin loading. Filtering the plugin out with SGLang's own
``SGLANG_PLUGINS`` whitelist makes the same command fail at argument parsing.
"""
from importlib.metadata import entry_points

from harness import run_log

PLUGIN_LOG_LINE = "sglang-inkling-backend: --attention-backend inkling registered"


def test_entry_point_is_installed():
    plugins = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert plugins.get("inkling") == "sglang_inkling_backend.entry_points.sglang:register", plugins


# The Gemma-3 bf16 run that test_bf16_agreement.py serves anyway (the session serves each configuration once): a
# server of its own for this test cost about 100 s of CI. The dense model (SmolLM2) is served on inkling by
# test_bf16_agreement.py under INKLING_FULL_INTEGRATION=1 and on the H200 by the GPU harness.
MODEL = "gemma-3-270m"


def test_server_registers_the_plugin_through_its_entry_point(workload, server_logs):
    run = workload(MODEL, "inkling")
    assert run.answers["reference"].output_ids  # it served with --attention-backend inkling
    log = run_log(server_logs, MODEL, "inkling")
    assert "'attention_backend': 'inkling'" in log  # SGLang's own echo of the resolved server arguments
    assert "Failed to load plugin inkling" not in log
    assert "registering --attention-backend inkling FAILED" not in log


def test_whitelist_without_inkling_rejects_the_backend(model_dir, failed_startup):
    log = failed_startup(model_dir("smollm2-135m-instruct"), "inkling", env={"SGLANG_PLUGINS": "__no_such_plugin__"})
    assert "invalid choice: 'inkling'" in log, log[-3000:]

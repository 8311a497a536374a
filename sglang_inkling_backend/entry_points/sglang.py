"""SGLang entry point (group ``sglang.srt.plugins``): makes ``--attention-backend inkling`` exist.

SGLang calls ``register()`` once per process (launcher, scheduler, detokenizer, ...) through
``sglang.srt.plugins.load_plugins()``, before it parses arguments. ``register()`` never raises: a plugin must not
break SGLang for users who do not select it. A failure is logged on this package's own logger with its cause.

Registration, each step skipped when already done (so a second call is a no-op):
1. the SGLang version check (``sglang_inkling_backend.hosts.sglang.version``). On a release outside the supported
   range, steps 2-3 still run (so ``--attention-backend inkling`` parses and is refused when the backend is built,
   naming the flag and the range), steps 4-5 do not (they reach into SGLang internals), and a WARNING says so;
2. ``inkling`` in SGLang's CLI choices: ``--attention-backend`` / ``--prefill-attention-backend`` /
   ``--decode-attention-backend`` share one list; the speculative draft list is separate;
3. ``inkling`` in SGLang's attention registry (factory ``InklingAttnBackend(runner)``, imported lazily);
4. the resolution and KV-pool hooks (``sglang_inkling_backend.hosts.sglang.hooks``);
5. on Apple silicon, the hook into SGLang's MLX runner (``sglang_inkling_backend.hosts.sglang.mlx_runner``).
"""
from __future__ import annotations

import logging
import platform
import sys

logger = logging.getLogger("sglang_inkling_backend.hosts.sglang")

from sglang_inkling_backend.hosts.sglang import BACKEND_NAME


def create_inkling_backend(runner):
    """Factory SGLang calls in the scheduler process to build the backend for one model runner. The version check
    comes first: on an unsupported SGLang the backend module may not even import."""
    from sglang_inkling_backend.hosts.sglang.version import check_sglang_version

    check_sglang_version()
    from sglang_inkling_backend.hosts.sglang.backend import InklingAttnBackend

    return InklingAttnBackend(runner)


def _register() -> None:
    from sglang_inkling_backend.hosts.sglang.version import UnsupportedSGLangVersion, check_sglang_version

    try:
        check_sglang_version()
        supported = True
    except UnsupportedSGLangVersion as err:
        supported = False
        logger.warning("%s --attention-backend %s is listed and refuses when selected; SGLang otherwise runs as "
                       "usual.", err, BACKEND_NAME)
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention import attention_registry

    if BACKEND_NAME not in choices.ATTENTION_BACKEND_CHOICES:
        choices.add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in choices.DRAFT_ATTENTION_BACKEND_CHOICES:
        choices.add_draft_attention_backend_choices([BACKEND_NAME])
    if attention_registry.ATTENTION_BACKENDS.get(BACKEND_NAME) is not create_inkling_backend:
        attention_registry.register_attention_backend(BACKEND_NAME)(create_inkling_backend)
    if not supported:
        return
    from sglang_inkling_backend.hosts.sglang import hooks

    hooks.install()
    if is_apple_silicon():
        from sglang_inkling_backend.hosts.sglang.mlx_runner import register_mlx_hooks

        register_mlx_hooks()
    _apply_hooks_outside_plugin_loading()


def is_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def _apply_hooks_outside_plugin_loading() -> None:
    """``load_plugins()`` applies every plugin's HookRegistry hooks after the last plugin ran. Called any other way
    (a test, a user importing us by hand), apply them here; inside ``load_plugins()`` applying early would freeze
    the targets before other plugins register theirs."""
    from sglang.srt.plugins.hook_registry import HookRegistry, _current_plugin_source

    if _current_plugin_source.get() is None:
        HookRegistry.apply_hooks()


def is_registered() -> bool:
    """Whether this process can serve ``--attention-backend inkling`` (choices, registry and hooks in place)."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention import attention_registry

    from sglang_inkling_backend.hosts.sglang import hooks

    return (BACKEND_NAME in choices.ATTENTION_BACKEND_CHOICES
            and attention_registry.ATTENTION_BACKENDS.get(BACKEND_NAME) is create_inkling_backend
            and hooks.installed())


def register() -> None:
    """The ``sglang.srt.plugins`` entry point. Never raises (the module docstring says why)."""
    try:
        _register()
    except Exception as err:  # noqa: BLE001
        logger.error("sglang-inkling-backend: registering --attention-backend %s FAILED, the backend is NOT available "
                     "in this process (SGLang otherwise runs as usual): %s: %s", BACKEND_NAME, type(err).__name__, err)
        return
    if is_registered():
        logger.info("sglang-inkling-backend: --attention-backend %s registered", BACKEND_NAME)

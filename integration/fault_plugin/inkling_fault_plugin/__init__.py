"""A deliberately broken inkling backend, for showing that the integration checks can fail (test-only).

Found by SGLang through the ``sglang.srt.plugins`` entry point of the ``inkling_fault_plugin`` distribution next to
this folder, which is on the server's PYTHONPATH only in the runs that ask for it
(``integration/harness.py:FAULT_PLUGIN_DIR``). ``register()`` makes every ``--attention-backend inkling`` layer
attend with its softmax scale multiplied by ``SOFTMAX_SCALE_FACTOR``: the backend still serves, at a wrong
temperature, which is the kind of bug a parity check must catch.
"""
import dataclasses

SOFTMAX_SCALE_FACTOR = 1.25


def register() -> None:
    from sglang_inkling_backend.hosts.sglang.backend import InklingAttnBackend

    if getattr(InklingAttnBackend._layer_spec, "inkling_fault", False):
        return
    correct = InklingAttnBackend._layer_spec

    def wrong_softmax_scale(self, layer):
        spec = correct(self, layer)
        return dataclasses.replace(spec, softmax_scale=spec.scale * SOFTMAX_SCALE_FACTOR)

    wrong_softmax_scale.inkling_fault = True
    InklingAttnBackend._layer_spec = wrong_softmax_scale

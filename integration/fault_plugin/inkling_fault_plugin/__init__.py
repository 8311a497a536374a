"""A deliberately broken inkling backend, for showing that the integration checks can fail (test-only).

Found by SGLang through the ``sglang.srt.plugins`` entry point of the ``inkling_fault_plugin`` distribution next to
this folder, which is on the server's PYTHONPATH only in the runs that ask for it
(``integration/harness.py:FAULT_PLUGIN_DIR``). ``register()`` makes every ``--attention-backend inkling`` layer
attend with its softmax scale multiplied by ``SOFTMAX_SCALE_FACTOR``: the backend still serves, at a wrong
temperature, which is the kind of bug a parity check must catch. With ``INKLING_FAULT=verify_sees_no_drafts`` it
breaks speculative verify steps only (see ``_verify_sees_no_drafts``).
"""
import dataclasses
import os

SOFTMAX_SCALE_FACTOR = 1.25
# INKLING_FAULT=verify_sees_no_drafts instead: every speculative verify step's draft sees only the cached prefix and
# itself (an identity tree mask, which SpecVerify's checks accept), not the drafts before it.
FAULT_ENV = "INKLING_FAULT"


def register() -> None:
    if os.environ.get(FAULT_ENV) == "verify_sees_no_drafts":
        _verify_sees_no_drafts()
        return
    from sglang_inkling_backend.hosts.sglang.backend import InklingAttnBackend

    if getattr(InklingAttnBackend._layer_spec, "inkling_fault", False):
        return
    correct = InklingAttnBackend._layer_spec

    def wrong_softmax_scale(self, layer):
        spec = correct(self, layer)
        return dataclasses.replace(spec, softmax_scale=spec.scale * SOFTMAX_SCALE_FACTOR)

    wrong_softmax_scale.inkling_fault = True
    InklingAttnBackend._layer_spec = wrong_softmax_scale


def _verify_sees_no_drafts() -> None:
    import torch

    from sglang_inkling_backend.attention_inputs import SpecVerify
    from sglang_inkling_backend.hosts.sglang import backend

    if getattr(backend.spec_verify_of, "inkling_fault", False):
        return
    correct = backend.spec_verify_of

    def identity_mask(spec_info, seq_lens_host):
        verify = correct(spec_info, seq_lens_host)
        d = verify.draft_lens[0]
        eye = torch.eye(d, dtype=torch.bool, device=verify.tree_mask.device).reshape(-1)
        return SpecVerify(eye.repeat(len(verify.draft_lens)), verify.mask_indptr, verify.depths)

    identity_mask.inkling_fault = True
    backend.spec_verify_of = identity_mask

"""The main job: a real model from PyPI served by the real SGLang on CPU with ``--attention-backend inkling``.

``python -m sglang_inkling_backend.demo [--prompt ...]``; see ``__main__.py``.
"""

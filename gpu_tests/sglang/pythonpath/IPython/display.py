"""Test-only stand-in for the two names ``sglang/utils.py`` imports; calling them raises."""


class HTML:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("IPython.display.HTML: test-only stand-in (gpu_tests/sglang/pythonpath)")


def display(*args, **kwargs):
    raise NotImplementedError("IPython.display.display: test-only stand-in (gpu_tests/sglang/pythonpath)")

"""Test-only stand-in: ``sglang/utils.py`` imports ``IPython.display`` at module level (notebook helpers that a
server never calls); the GPU machine has no IPython."""

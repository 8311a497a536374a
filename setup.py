"""Only the package list lives here: everything else is in pyproject.toml."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["sglang_inkling_backend", "sglang_inkling_backend.*"])
      + ["sglang_inkling_backend.entry_points"])

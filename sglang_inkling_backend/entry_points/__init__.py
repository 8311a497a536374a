"""Entry points named in pyproject.toml, one module per host."""

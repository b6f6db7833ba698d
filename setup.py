"""The one compiled piece: the reader's line finder (otel_rollout/_scan.c).

Optional: where no C compiler is found, the package installs without it and the
reader finds lines in Python (the same results, ~12x slower at that step).
Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("otel_rollout._scan", sources=["otel_rollout/_scan.c"], optional=True),
    ]
)

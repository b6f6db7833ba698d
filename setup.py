"""The compiled pieces: the caller's emit (otel_rollout/_emit.c), the reader's line
finder (otel_rollout/_scan.c), a step's batch-age sums (otel_rollout/_age.c) and the
one pass's path for the commonest lines (otel_rollout/_hot.c).

Optional: where no C compiler is found, the package installs without them; the
reader finds lines in Python (the same results, ~12x slower at that step), every
line takes the pass's Python path (the same results, slower) and emit is a Python
closure (the same events, ~0.4 us more of the caller's time each).
Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("otel_rollout._scan", sources=["otel_rollout/_scan.c"], optional=True),
        Extension("otel_rollout._age", sources=["otel_rollout/_age.c"], optional=True),
        Extension(
            "otel_rollout._emit",
            sources=["otel_rollout/_emit.c"],
            depends=["otel_rollout/_emit_json.h", "otel_rollout/_emit_wait.h", "otel_rollout/_emit_lines.h"],
            optional=True,
        ),
        Extension(
            "otel_rollout._hot",
            sources=["otel_rollout/_hot.c"],
            depends=[
                "otel_rollout/_hot_line.h",
                "otel_rollout/_hot_number.h",
                "otel_rollout/_hot_lanes.h",
                "otel_rollout/_hot_fold.h",
                "otel_rollout/_hot_apply.h",
                "otel_rollout/_hot_history.h",
            ],
            optional=True,
        ),
    ]
)

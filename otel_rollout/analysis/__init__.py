"""Files in → one pass → analyses: every number the offline tools show comes from here.

:mod:`.engine` runs any number of :class:`Analysis` classes over one read of a
file; :mod:`.state` is what the pass keeps once for all of them (its records in
:mod:`.records`, carried work in :mod:`.carry`); each other module is one analysis.
"""

from .engine import Analysis, Engine, OnWarning, run_events, run_file
from .state import State, Stop
from .steps import BATCH_AGE_EVENTS, SealedCounts, StepAges

__all__ = [
    "BATCH_AGE_EVENTS",
    "Analysis",
    "Engine",
    "OnWarning",
    "SealedCounts",
    "State",
    "StepAges",
    "Stop",
    "run_events",
    "run_file",
]

"""The whole trace file on one time axis, as a Chrome Trace Event Format file.

One analysis of the pass (:class:`Timeline`) writes a JSON object with
``traceEvents`` that Perfetto UI, ``chrome://tracing`` and speedscope open:

* one process (``pid``) per run, named by a ``process_name`` metadata event
  holding the run's ID; a stop is the gap between two runs;
* a ``trainer`` thread: a slice per ``train.step`` (``args.step``,
  ``args.trained_version``, ``args.batch_age`` from the same arithmetic as
  ``batch-age``, with the seals read so far), and checkpoint publish/restore
  instants; a ``weights`` thread: each refit (``weights.sync``) as an instant
  with the calls it paused, and as a slice when it logs its ``duration_s``;
* engine lanes (threads ``engine lane N``): every attempt as slices from its
  dispatch or resume to its seal, refusal or abandonment, packed greedily
  onto the lowest free lane so that attempts on one lane never overlap.  An
  attempt is split at the refits that changed the weights under it, each
  segment named and coloured (``cname``) by the weight version that
  generated its tokens; a refit that paused one of its calls shows as a
  ``paused`` segment when the refit logged its duration;
* counters: the engine's weight version, attempts in flight, groups in
  flight (generating and sealed), batch age per step.

Time is microseconds from the file's first event, the same for a file cut
down with ``runs`` or ``steps``.  Events are written as they are made; memory
is the attempts in flight, the refits they span and the lanes, plus the
shared state of the pass.
"""

from .analysis import Timeline, TimelineSummary
from .cuts import RunSelector, StepRange, Window, step_windows
from .trace_events import PALETTE, TraceEventWriter

__all__ = [
    "PALETTE",
    "RunSelector",
    "StepRange",
    "Timeline",
    "TimelineSummary",
    "TraceEventWriter",
    "Window",
    "step_windows",
]

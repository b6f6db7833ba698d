"""The export sidecar keeps its collector's work small: it freezes the trackers it loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env

pytest.importorskip("tensorboardX")

# Runs a sidecar over a finished trace with TensorBoard on, and stops it once the tracker's
# run is open and the file read; then tells what the collector looked like.
_SCRIPT = """
import gc, json, sys, threading, time
from pathlib import Path
from otel_rollout import otel
from otel_rollout.sidecar import Sidecar
from otel_rollout.testing import synthetic_trace

log = synthetic_trace(Path(sys.argv[1]) / "t.jsonl", 3000, runs=1)
chosen = otel.settings(trackers=f"tensorboard:{sys.argv[1]}/tb")
sidecar = Sidecar(log, chosen)
before = gc.get_freeze_count()

def stop_when_open():
    deadline = time.monotonic() + 60
    hub = sidecar.telemetry.trackers
    while hub.opened == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # a few more turns of the loop
    sidecar.stop()

threading.Thread(target=stop_when_open, daemon=True).start()
sidecar.run()
loaded = [o for o in gc.get_objects() if isinstance(o, type)
          and o.__module__.startswith("tensorboardX")]
print(json.dumps({"before": before, "after": gc.get_freeze_count(),
                  "young": gc.get_threshold()[0], "opened": sidecar.telemetry.trackers.opened,
                  "imported": "tensorboardX" in sys.modules, "unfrozen": len(loaded)}))
"""


def test_the_sidecar_freezes_what_its_trackers_load(tmp_path: Path) -> None:
    """A sidecar that made a TensorBoard run has moved its objects (the library's among them)
    to the collector's permanent generation, and collects the young ones less often."""
    from otel_rollout.sidecar._process import YOUNG_OBJECTS

    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["opened"] == 1
    assert found["young"] == YOUNG_OBJECTS
    # TensorBoard's library, imported when its run was made (after the sidecar began), is
    # frozen: none of its classes is left for the collector to walk.
    assert found["imported"] and found["unfrozen"] == 0, found
    assert found["after"] > found["before"] + 10_000, found

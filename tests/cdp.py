"""A page in headless Chromium driven over the DevTools protocol: evaluate script, move
and click a real mouse, and collect console messages and uncaught exceptions."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
import websocket

from otel_rollout.render.html import CHROMIUM_FLAGS, chromium

INSTALL = "apt-get install -y --no-install-recommends chromium"


class Page:
    """One tab: :meth:`call` sends a DevTools command and waits for its answer; the events
    that arrive meanwhile are kept (console lines in :attr:`console`, exceptions in
    :attr:`errors`)."""

    def __init__(self, ws_url: str) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=120, suppress_origin=True)
        self.ids = itertools.count(1)
        self.console: list[str] = []
        self.errors: list[str] = []
        self.loaded = False

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled":
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.console.append(f"{params['type']}: {args}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description", details["text"]))
        elif method == "Log.entryAdded":
            entry = params["entry"]
            self.console.append(f"{entry['level']}: {entry['text']}")
        elif method == "Page.loadEventFired":
            self.loaded = True

    def eval(self, expression: str) -> Any:
        """The value of ``expression`` in the page (JSON-able), raising on an exception."""
        found = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in found:
            raise RuntimeError(found["exceptionDetails"])
        return found["result"].get("value")

    def box(self, element_id: str) -> dict[str, float]:
        """Where element ``element_id`` is in the window (``x``, ``y``, ``w``), scrolled
        into view."""
        return self.eval(
            "(function (e) { e.scrollIntoView({block: 'center'});"
            " var r = e.getBoundingClientRect(); return {x: r.left, y: r.top, w: r.width}; })"
            f"(document.getElementById('{element_id}'))"
        )

    def outer(self, element_id: str) -> str:
        """Element ``element_id`` as the browser serialises it now."""
        return self.eval(f"document.getElementById('{element_id}').outerHTML")

    def open(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self.loaded = False
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 120
        while not self.loaded and time.monotonic() < deadline:
            self._event(json.loads(self.ws.recv()))
        assert self.loaded, f"{url} did not load"

    def mouse(self, kind: str, x: float, y: float, buttons: int = 0) -> None:
        """One real mouse event at page pixel ``(x, y)`` (``kind``: moved, pressed, released)."""
        params: dict[str, Any] = {"type": f"mouse{kind.capitalize()}", "x": x, "y": y}
        if kind != "moved" or buttons:
            params.update(button="left", buttons=buttons, clickCount=1 if kind != "moved" else 0)
        self.call("Input.dispatchMouseEvent", **params)

    def drag(self, x0: float, x1: float, y: float, steps: int = 8) -> None:
        """Press the left button at ``x0``, move in ``steps`` to ``x1``, release there."""
        self.mouse("moved", x0, y)
        self.mouse("pressed", x0, y, 1)
        for k in range(1, steps + 1):
            self.mouse("moved", x0 + (x1 - x0) * k / steps, y, 1)
        self.mouse("released", x1, y)

    def enter(self) -> None:
        """Press and release the Enter key in the focused element."""
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter",
                      windowsVirtualKeyCode=13)  # fmt: skip

    def click(self, x: float, y: float) -> None:
        self.mouse("moved", x, y)
        self.mouse("pressed", x, y, 1)
        self.mouse("released", x, y)


@contextmanager
def browser(tmp_path: Path, width: int = 1000, height: int = 900) -> Iterator[Page]:
    """Headless Chromium on a DevTools port of its choosing (127.0.0.1), one blank tab."""
    found = chromium()
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Chromium is not installed ({INSTALL})")
        pytest.skip(f"Chromium is not installed ({INSTALL})")
    log = tmp_path / "chromium.log"
    with open(log, "w") as stderr:  # a file, not a pipe nobody drains once the port is read
        proc = subprocess.Popen(
            [found, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'cdp-profile'}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", log.read_text())
            port = int(m.group(1)) if m else time.sleep(0.1)
        assert port, f"Chromium did not open its DevTools port: {log.read_text()[-2000:]}"
        with urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as answer:
            tabs = [t for t in json.load(answer) if t["type"] == "page"]
        page = Page(tabs[0]["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log"):
            page.call(f"{domain}.enable")
        yield page
        page.ws.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)

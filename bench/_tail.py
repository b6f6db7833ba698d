"""Run as a separate process: tail a trace file and print each event's emit-to-file latency
(every event but run.start).

Stops at the first ``bench.end`` event, then prints the latencies (seconds) as JSON.
"""

import os
import sys
import time

import orjson


def main() -> None:
    path = sys.argv[1]
    while not os.path.exists(path):
        time.sleep(0.0001)
    fd = os.open(path, os.O_RDONLY)
    pending = b""
    latencies = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            time.sleep(0.0001)
            continue
        now = time.time()
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            event = orjson.loads(line)
            if event["event"] == "bench.end":
                sys.stdout.write(orjson.dumps(latencies).decode())
                return
            if event["event"] != "run.start":
                latencies.append(now - event["t"])


if __name__ == "__main__":
    main()

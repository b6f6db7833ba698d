"""Run as a separate process: tail a trace file and print each event's emit-to-file latency
(every event but run.start).

Stops at the first ``bench.end`` event, then prints the latencies (seconds) as JSON.
"""

import sys
import time

import orjson

from otel_rollout.follow import FileFollower


def main() -> None:
    follower = FileFollower(sys.argv[1])
    latencies = []
    while True:
        lines = follower.read().lines
        if not lines:
            time.sleep(0.0001)
            continue
        now = time.time()
        for line in lines:
            event = orjson.loads(line)
            if event["event"] == "bench.end":
                sys.stdout.write(orjson.dumps(latencies).decode())
                return
            if event["event"] != "run.start":
                latencies.append(now - event["t"])


if __name__ == "__main__":
    main()

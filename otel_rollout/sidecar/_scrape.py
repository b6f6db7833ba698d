"""What the sidecar's Prometheus endpoint serves beyond the SDK's readers: the one run it
serves (each run keeps its metrics in a registry of its own) and the spans it made, sent
and could not send.  Collectors of ``prometheus_client``, read at each scrape on the
endpoint's thread."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ServedRun", "SpanCounts"]


class ServedRun:
    """The run served: ``registry()`` gives its registry (None: no run yet), collected at
    each scrape, so that the endpoint moves to another run without a gap or a mix."""

    def __init__(self, registry: Callable[[], Any]) -> None:
        self._registry = registry

    def describe(self) -> list[Any]:
        return []  # which run, and so which series, is decided at each scrape

    def collect(self) -> Iterator[Any]:
        registry = self._registry()
        if registry is not None:
            yield from registry.collect()


class SpanCounts:
    """``rollout_spans_total{outcome}``: the spans the sidecar made, sent, and could not
    send (the collector refused them or timed out), across every run it followed, from
    ``counts()`` → (made, sent, not sent).  The ``RolloutSpansDropping`` alert watches
    ``not_sent``."""

    def __init__(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        self._counts = counts

    def describe(self) -> list[Any]:
        return []  # no collect at registration: the counts are read at each scrape

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        made, sent, failed = self._counts()
        family = CounterMetricFamily(
            "rollout_spans",
            "Spans the export sidecar made from the log, sent, and could not send",
            labels=["outcome"],
        )
        family.add_metric(["made"], made)
        family.add_metric(["sent"], sent)
        family.add_metric(["not_sent"], failed)
        yield family

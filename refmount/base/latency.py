"""``Latency``: a distribution of durations in fixed buckets, for the metrics' histograms.

Observed on the read path (a FUSE read, an HTTP request, a fetch from a target), so it costs
one ``bisect`` over a short tuple and two additions; the exposition
(``serving/metrics.py``) makes the cumulative counts Prometheus wants when it is scraped.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["BUCKETS", "Latency"]

# upper bounds in seconds (each bucket holds durations <= its bound); one more for the rest
BUCKETS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                              0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Latency:
    """Counts of durations per bucket of ``BUCKETS`` (the last one past them all) and their sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    def add(self, other: Latency) -> None:
        """Add ``other``'s counts to these (several sets' reads shown as one)."""
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.total += other.total

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count of durations <= le)`` per bound, ``+Inf`` last: a histogram's buckets."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip((*map(repr, BUCKETS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)

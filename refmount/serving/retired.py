"""The final counters of the set versions a serving process has closed.

The metrics (``serving/metrics.py``) add up the counters of the sets open now. A version that
closes (an idle set closed by ``max_open_sets``, a version replaced by a reload, a set gone
from the catalogue) would take its counts out of that sum, and Prometheus would read the
drop as a counter reset. So whoever closes versions (``sets/opensets.py``) folds each one's
final counters in here once its core is closed, and the collector adds them to the open
sets': every exported counter only goes up while the process runs.
"""

from __future__ import annotations

from typing import Any

from refmount.base.stats import Stats
from refmount.cache.writer import DiskCounters

__all__ = ["RetiredCounters"]

# Stats' integers that are a state now, not a count: never folded
GAUGES = frozenset({"open_files"})


class RetiredCounters:
    """Sums of the counters of closed cores: ``stats`` (its integers, latency histograms and
    counts per protocol), memory cache evictions and the disk cache writer's counts."""

    def __init__(self) -> None:
        self.stats = Stats()
        self.memory_evictions = 0
        self.disk = DiskCounters()
        self.cores = 0

    def fold(self, core: Any) -> None:
        """Add a closed core's counters (anything with a core's ``stats``, ``reader`` and
        ``writer``; what it lacks counts nothing)."""
        self.cores += 1
        stats = getattr(core, "stats", None)
        if isinstance(stats, Stats):
            mine = self.stats
            for name, value in vars(stats).items():
                if type(value) is int and name not in GAUGES:
                    setattr(mine, name, getattr(mine, name) + value)
            mine.started = min(mine.started, stats.started)
            mine.request_latency.add(stats.request_latency)
            mine.fetch_latency.add(stats.fetch_latency)
            for protocol, counts in stats.protocols.items():
                into = mine.protocols.setdefault(protocol, [0] * len(counts))
                for i, n in enumerate(counts):
                    into[i] += n
        memory = getattr(getattr(core, "reader", None), "memory", None)
        self.memory_evictions += getattr(memory, "evictions", 0)
        writer = getattr(core, "writer", None)
        if writer is not None:
            self.disk.add(writer.counters())

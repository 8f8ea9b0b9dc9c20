"""How much to keep in flight to a host: latency and bandwidth from the requests themselves.

A reader going through a target in order is kept ahead of by readahead requests. How many
bytes must be in flight so that it never waits depends on the link: behind an object store
each request's first byte costs 20-100 ms, and a window of a few MiB in one request leaves
the reader waiting a round trip per window. ``LinkEstimate`` fits ``seconds = latency +
bytes / bandwidth`` to the last requests of a host (least squares over their sizes and
times), and ``window`` sizes the bytes kept ahead of a reader from it: enough requests in
flight to stream at ``PARALLEL`` times one request's bandwidth while each waits out its
latency -- ``PARALLEL x bandwidth-delay product + one request``. On a fast link (BDP near
zero) that is one request: the window then grows only as the reader shows it needs more.

Requests keep the caller's size (``TargetReadahead.REQUEST_LIMIT``). Smaller requests, more
of them in flight, deliver sooner behind latency in simulation, but on a fast link each costs
the daemon CPU (10,000 x 64 KiB files, 32 readers, loopback: 15 % fewer files/s with 4 MiB
requests instead of 8 MiB), so they are not used.

Requests of equal size do not tell latency from transfer time: the estimate then takes the
shortest request's time as the latency (an upper bound: more in flight, never less) and its
rate as the bandwidth. Until a host has answered ``MIN_SAMPLES`` requests there is no
estimate and callers keep their defaults. Everything is bounded by the caller's ceiling.
"""

from __future__ import annotations

from collections import deque
from urllib.parse import urlsplit

from refmount.base.lru import LRU


class LinkEstimate:
    SAMPLES = 32  # the last requests the fit uses
    MIN_SAMPLES = 2
    PARALLEL = 4  # requests streaming at once, each at the bandwidth one request gets

    def __init__(self) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=self.SAMPLES)
        self._fit: tuple[float, float] | None = None

    def observe(self, nbytes: int, seconds: float) -> None:
        """A request of ``nbytes`` took ``seconds`` from start to its last byte."""
        if nbytes > 0 and seconds > 0:
            self._samples.append((nbytes, seconds))
            self._fit = None

    def __len__(self) -> int:
        """The requests kept for the fit (at most ``SAMPLES``)."""
        return len(self._samples)

    def estimate(self) -> tuple[float, float] | None:
        """(latency in seconds, bandwidth of one request in bytes per second), or None."""
        if len(self._samples) < self.MIN_SAMPLES:
            return None
        if self._fit is None:
            self._fit = self._compute()
        return self._fit

    def _compute(self) -> tuple[float, float]:
        n = len(self._samples)
        mx = sum(b for b, _ in self._samples) / n
        my = sum(s for _, s in self._samples) / n
        sxx = sum((b - mx) ** 2 for b, _ in self._samples)
        sxy = sum((b - mx) * (s - my) for b, s in self._samples)
        if sxx > 0 and sxy > 0:
            per_byte = sxy / sxx
            latency = my - per_byte * mx
            if latency >= 0:
                return latency, 1 / per_byte
        # One size only (or noise hiding the slope): the shortest request bounds the latency.
        shortest = min(s for _, s in self._samples)
        return shortest, max(b / s for b, s in self._samples)

    def bdp(self) -> int | None:
        """Latency x bandwidth: the bytes one request could carry while waiting its first byte."""
        est = self.estimate()
        return None if est is None else int(est[0] * est[1])

    def window(self, piece: int, lo: int, hi: int) -> int:
        """Bytes to keep ahead of a reader reading through requests of ``piece`` bytes:
        ``PARALLEL x BDP + piece``, in [lo, hi] (``lo`` without an estimate)."""
        bdp = self.bdp()
        if bdp is None:
            return min(lo, hi)
        return max(lo, min(self.PARALLEL * bdp + piece, hi))


class LinkEstimates:
    """One ``LinkEstimate`` per host (scheme and network location), at most ``MAX_HOSTS``."""

    MAX_HOSTS = 1024

    def __init__(self) -> None:
        self._hosts: LRU[str, LinkEstimate] = LRU(self.MAX_HOSTS)

    def of(self, url: str) -> LinkEstimate:
        parts = urlsplit(url)
        host = f"{parts.scheme}://{parts.netloc}"
        link = self._hosts.get(host)
        if link is None:
            link = LinkEstimate()
            self._hosts.put(host, link)
        return link

    def __len__(self) -> int:
        """The hosts with an estimate kept (at most ``MAX_HOSTS``)."""
        return len(self._hosts)

"""Single-flight: concurrent requests for the same thing share one load.

``SingleFlight[K, V]`` maps a key to the ``Flight`` loading it. The first caller of
``run(key, load)`` leads: it runs ``load()``; callers that come while it runs wait for it
and get its result or its error. A leader that is cancelled (its reader went away) does not
fail the others: they try again, one of them leading. The map holds only loads in flight,
so it is bounded by the loads the caller starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import trio

K = TypeVar("K")
V = TypeVar("V")


class Flight(Generic[V]):
    """One load that others wait for: ``done`` is set once ``result`` or ``error`` is."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: V | None = None
        self.error: BaseException | None = None

    async def wait(self) -> V | None:
        """The result once the load is done; raises its error."""
        await self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class SingleFlight(Generic[K, V]):
    __slots__ = ("_flights",)

    def __init__(self) -> None:
        self._flights: dict[K, Flight[V]] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._flights

    def __len__(self) -> int:
        return len(self._flights)

    async def run(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        """``load()``'s result, shared with every concurrent caller for ``key``."""
        flights = self._flights
        while True:
            flight = flights.get(key)
            if flight is None:
                break
            await flight.done.wait()
            if flight.error is None:
                return flight.result  # type: ignore[return-value]
            if not isinstance(flight.error, trio.Cancelled):
                raise flight.error
            # The leader was cancelled: try again (one of the waiters leads).
        flight = flights[key] = Flight()
        try:
            result = flight.result = await load()
            return result
        except BaseException as e:
            flight.error = e
            raise
        finally:
            del flights[key]
            flight.done.set()

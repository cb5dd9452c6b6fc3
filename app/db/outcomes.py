"""A future's outcomes (a closed union), and the finished ones a process keeps in memory for a short while.

The Trainer or Sampler that finishes a future writes its outcome to the database, then returns it in its reply to
the ingress's call; the ingress keeps it (`RecentOutcomes`, held by its FutureStore) for the long-poll, which answers
without reading the future's row. Only what the database holds as final is kept: an outcome gets here once the
update that finished its pending row has committed, and a finished row never changes again (cancel_future, and
every other write, only touch pending rows), so an entry never disagrees with the row. The row stays the source of
truth: another ingress replica, or a poll after the entry is gone (read once, evicted, too old, a restart), reads it.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pending:
    request_id: str
    queue_state: str = "active"


@dataclass(frozen=True)
class Completed:
    request_id: str
    payload: bytes
    content_type: str
    kind: str = ""


@dataclass(frozen=True)
class Failed:
    request_id: str
    error: dict


@dataclass(frozen=True)
class Unknown:
    request_id: str


Outcome = Pending | Completed | Failed | Unknown
Written = Completed | Failed  # what finishing a future wrote: a Trainer's or Sampler's reply carries it

# Outcomes normally wait here for milliseconds: the client's long-poll is usually open when its future finishes, and
# the SDK fetches a sample's payload as soon as retrieve_futures reports it. The bounds only stop outcomes nobody
# fetches here (a client polling another replica, or gone) from growing the process: 4096 covers many clients'
# pipelined operations at once, and 64 MiB some hundreds of large forward_backward results.
MAX_ENTRIES = 4096
MAX_BYTES = 64 * 2**20
# Under limits.future_retention_seconds' least value (60 s): an entry never outlives the row that it copies.
MAX_AGE_S = 30.0
_ENTRY_BYTES = 200  # about what an entry costs beside its payload or error


def size_of(outcome: Written) -> int:
    """About the memory an outcome holds."""
    if isinstance(outcome, Completed):
        return _ENTRY_BYTES + len(outcome.payload)
    return _ENTRY_BYTES + len(json.dumps(outcome.error, default=str))


@dataclass(frozen=True)
class _Entry:
    outcome: Written
    owner: str | None
    size: int
    kept_at: float


class RecentOutcomes:
    """Finished futures' outcomes by request id, oldest first, within `max_entries`, `max_bytes` and `max_age_s`.
    An entry may remember its owner: the user whose request made the future, which the ingress knew then."""

    def __init__(
        self,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, outcome: Written, owner: str | None = None) -> None:
        """Keep `outcome` (only ever one that the database holds as final), replacing what its future had here;
        the oldest entries go to make room. One larger than `max_bytes` is not kept."""
        self.forget(outcome.request_id)
        now = self._clock()
        while self._entries:  # entries are in the order they were kept: the too old ones are first
            oldest = next(iter(self._entries.values()))
            if now - oldest.kept_at <= self._max_age_s:
                break
            self.forget(oldest.outcome.request_id)
        size = size_of(outcome)
        if size > self._max_bytes:
            return
        self._entries[outcome.request_id] = _Entry(outcome, owner, size, now)
        self.nbytes += size
        while len(self._entries) > self._max_entries or self.nbytes > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.nbytes -= evicted.size

    def owned_by(self, request_id: str, user: str) -> bool:
        """Whether the future's outcome is here and remembers `user` as its owner. False says nothing: ask the
        database (the owner may not be known here, or the future was made before owners were recorded)."""
        entry = self._fresh(request_id)
        return entry is not None and entry.owner is not None and entry.owner == user

    def take(self, request_id: str) -> Written | None:
        """The future's outcome, which leaves; None when it is not here (read the database)."""
        entry = self._fresh(request_id)
        if entry is None:
            return None
        self.forget(request_id)
        return entry.outcome

    def forget(self, request_id: str) -> None:
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self.nbytes -= entry.size

    def _fresh(self, request_id: str) -> _Entry | None:
        entry = self._entries.get(request_id)
        if entry is not None and self._clock() - entry.kept_at > self._max_age_s:
            self.forget(request_id)
            return None
        return entry

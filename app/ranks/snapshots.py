"""Rank 0's snapshot writer: a captured training state goes to storage on a thread while training goes on.

One snapshot is written at a time: taking the next waits for the previous write, so once a snapshot is taken
its predecessor is whole on storage (what app.db.journal relies on). A write that fails is logged; recovery then
falls back to the snapshot before it."""

from __future__ import annotations

import logging
import threading
import time

from app.storage.objects import ObjectStorage
from app.training.checkpoint import TrainingState, write_captured

logger = logging.getLogger("tinker_serve.worker")


class SnapshotWriter:
    def __init__(self, storage: ObjectStorage) -> None:
        self._storage = storage
        self._thread: threading.Thread | None = None

    def write(self, location: str, state: TrainingState) -> None:
        """Start writing `state` at `location` once the previous write is done."""
        self.flush()
        self._thread = threading.Thread(target=self._write, args=(location, state), daemon=True, name="snapshot")
        self._thread.start()

    def flush(self) -> None:
        """Wait for the write in progress, if any."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _write(self, location: str, state: TrainingState) -> None:
        started = time.monotonic()
        try:
            size = self._storage.write(location, lambda out: write_captured(state, out))
        except Exception:  # logged; recovery falls back to the previous snapshot
            logger.exception("snapshot %s was not written", location)
            return
        logger.info("snapshot %s written: %d bytes in %.3f s", location, size, time.monotonic() - started)

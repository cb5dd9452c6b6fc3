"""The application's replica counts, read from Serve's controller for the API's server_status view."""

from __future__ import annotations

import asyncio
import logging
import time

from ray import serve

from app.api.backends import ReplicaCounts

logger = logging.getLogger("tinker_serve.ingress")
ROLES = {"Trainer": "trainer", "Sampler": "sampler"}  # deployment name `Trainer:{name}` (deployments.trainer)


class ServeReplicaCounts(ReplicaCounts):
    """serve.status() of this replica's application, cached for `cache_s` (every open console polls it)."""

    def __init__(self, cache_s: float = 2.0) -> None:
        self._cache_s = cache_s
        self._read_at = -float("inf")
        self._counts: dict[tuple[str, str], dict[str, int]] = {}

    async def replicas(self) -> dict[tuple[str, str], dict[str, int]]:
        if time.monotonic() - self._read_at > self._cache_s:
            try:
                self._counts = await asyncio.to_thread(_read_counts)  # the controller call blocks
            except Exception:  # the view shows the counts as unknown
                logger.warning("could not read the deployments' replicas from Serve", exc_info=True)
                self._counts = {}
            self._read_at = time.monotonic()
        return self._counts


def _read_counts() -> dict[tuple[str, str], dict[str, int]]:
    app = serve.get_replica_context().app_name
    counts = {}
    for deployment, status in serve.status().applications[app].deployments.items():
        kind, _, name = deployment.partition(":")
        if kind in ROLES:
            states = {str(getattr(s, "value", s)): n for s, n in status.replica_states.items() if n}
            counts[(ROLES[kind], name)] = states
    return counts

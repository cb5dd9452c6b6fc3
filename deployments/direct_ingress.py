"""Direct ingress on one pinned port (`deployments/serve_env.single_node`): what the Ingress replica does in its
constructor, before Serve starts the replica's own HTTP server on that port.

Serve gives every direct-ingress replica a port from a range; pinned to one port, two of its behaviours would leave
the API down after a replica is replaced (a crash, or a redeploy with a changed config):
- it binds the replica's socket without SO_REUSEADDR, so for TCP's TIME_WAIT (60 s) after the old replica's
  connections close the bind fails, and Serve then blocks the port for good. The socket here gets the options
  Serve's own HTTP proxy binds its port with (SO_REUSEADDR and SO_REUSEPORT, as on 127.0.0.1:8000 before);
- it starts the new replica while the old one drains, and the old one holds the port until it is gone, so the new
  one's port request fails. The new replica waits here until the old one has stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from ray import serve

from deployments import serve_env

logger = logging.getLogger(__name__)

PREDECESSOR_WAIT_S = 60.0  # Serve's drain (5 s here) and a replica's exit take seconds; past this, go on anyway


def bind_like_serve_proxy() -> None:
    """Make this process's direct-ingress server bind with SO_REUSEADDR and SO_REUSEPORT (Serve's proxy's options).
    Fails loudly when Serve's internals moved (a Ray upgrade): the pinned port would otherwise break on restart."""
    from ray.serve._private import replica

    start = replica.start_asgi_http_server
    if getattr(start, "binds_like_serve_proxy", False):
        return

    async def start_reusing_the_address(*args: Any, **kwargs: Any) -> Any:
        return await start(*args, **{**kwargs, "enable_so_reuseport": True})

    start_reusing_the_address.binds_like_serve_proxy = True  # type: ignore[attr-defined]
    replica.start_asgi_http_server = start_reusing_the_address


def other_replicas(app: str, deployment: str, me: str | None) -> list[str]:
    """The live replica actors of `app`'s `deployment` other than `me` (Serve names them SERVE_REPLICA::app#dep#id)."""
    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    named = ray.util.list_named_actors(all_namespaces=True)
    return [a["name"] for a in named if a["name"].startswith(prefix) and a["name"] != me]


async def wait_for_predecessor() -> None:
    """Wait until no other replica of this deployment is alive: Serve hands out the pinned port only after the one
    that holds it is gone."""
    context = serve.get_replica_context()
    me = ray.get_runtime_context().get_actor_name()
    started = time.monotonic()
    while others := await asyncio.to_thread(other_replicas, context.app_name, context.deployment, me):
        if time.monotonic() - started > PREDECESSOR_WAIT_S:
            logger.warning("ingress: %s still alive after %.0f s; starting anyway", others, PREDECESSOR_WAIT_S)
            return
        await asyncio.sleep(0.5)
    if time.monotonic() - started > 0.5:
        logger.info("ingress: waited %.1f s for the replica before it to stop", time.monotonic() - started)
        await asyncio.sleep(1.0)  # the controller releases the port on its next loop


async def prepare() -> None:
    """Everything above, when direct ingress is pinned to one port; nothing otherwise (a range, or HAProxy)."""
    if serve_env.direct_port() is None:
        return
    bind_like_serve_proxy()
    await wait_for_predecessor()

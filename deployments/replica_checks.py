"""How Serve watches and stops every replica of this app (each deployment's options take `REPLICA_CHECKS`).

Serve notices a replica that died (killed, its process lost) only at its next health check of it, and starts a
replacement then: at Serve's default period, 10 s, a dead Sampler's samples, a dead Trainer's steps or a dead
Ingress's clients waited up to 11 s before a replacement even began to start. Each deployment's check reads state
in memory (the Trainer's worker-group state, vLLM's engine state), so a check every 2 s costs nothing measurable.

A stopping replica (a redeploy, a replacement, a scale-down) waits for its ongoing requests in rounds of
`graceful_shutdown_wait_loop_s`, at least one round even when idle: Serve's default 2 s a round; 0.5 s here.
"""

from __future__ import annotations

HEALTH_CHECK_PERIOD_S = 2.0
SHUTDOWN_WAIT_LOOP_S = 0.5
REPLICA_CHECKS = {"health_check_period_s": HEALTH_CHECK_PERIOD_S, "graceful_shutdown_wait_loop_s": SHUTDOWN_WAIT_LOOP_S}

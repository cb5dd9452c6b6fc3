"""The ingress's wiring runs in process, without Serve: `build_services` (the `api` fixture's Services come from it)
and every sweep of INGRESS_SWEEPS over them, with the periods the ingress has always swept at."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.api.wiring import INGRESS_SWEEPS
from app.config import ServerConfig
from tests.unit.api.conftest import InProcessApi


def _periods(**sections: Any) -> dict[str, tuple[float, float | None]]:
    """Each sweep's period and first delay (None: one period) under a config with these sections."""
    config = ServerConfig(base_models=[{"name": "tiny", "path": "models/tiny"}], **sections)
    return {
        sweep.what: (sweep.every.seconds(config), sweep.first_after and sweep.first_after.seconds(config))
        for sweep in INGRESS_SWEEPS
    }


def test_ingress_sweeps_keep_their_periods() -> None:
    assert _periods() == {  # the defaults: the caps
        "expired ephemeral samplers": (60.0, None),
        "silent sessions": (30.0, 300.0),
        "expired checkpoints": (60.0, None),
        "expired uploads": (60.0, None),
        "metadata past retention.metadata_retention_seconds": (3600.0, None),
        "expired stability records": (60.0, None),
        "trace entries beyond retention.max_trace_events_per_session": (60.0, None),
        "finished futures past retention.future_retention_seconds": (3600.0, None),
        "audit events past retention.audit_retention_days": (3600.0, None),
        "operations handed over again": (10.0, None),
        "stale sample futures": (60.0, None),
    }
    short = _periods(
        timeouts={"session_timeout_seconds": 40, "handover_check_seconds": 2, "sample_timeout_seconds": 20},
        retention={
            "ephemeral_sampler_ttl_seconds": 100,
            "checkpoint_sweep_seconds": 5,
            "metadata_retention_seconds": 400,
            "stability_record_ttl_seconds": 8,
            "future_retention_seconds": 120,
            "audit_retention_days": 1,
        },
        uploads={"sweep_seconds": 7},
    )
    assert short == {  # below the caps: a quarter of the TTL, or the field itself
        "expired ephemeral samplers": (25.0, None),
        "silent sessions": (10.0, 40.0),
        "expired checkpoints": (5.0, None),
        "expired uploads": (7.0, None),
        "metadata past retention.metadata_retention_seconds": (100.0, None),
        "expired stability records": (2.0, None),
        "trace entries beyond retention.max_trace_events_per_session": (60.0, None),
        "finished futures past retention.future_retention_seconds": (30.0, None),
        "audit events past retention.audit_retention_days": (3600.0, None),
        "operations handed over again": (2.0, None),
        "stale sample futures": (5.0, None),
    }


def test_every_ingress_sweep_runs_over_build_services(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_trace_events_per_session=1)
    for seq_id in (1, 2):  # two requests of one session: the trace sweep forgets the older
        api.run(api.services.futures.create("optim_step", "s1:train:0", seq_id))
    swept = {sweep.what: api.run(sweep.run(api.services)) for sweep in INGRESS_SWEEPS}
    assert swept == dict.fromkeys(swept, 0) | {"trace entries beyond retention.max_trace_events_per_session": 1}
    assert len(api.run(api.services.traces.events("s1", 10))) == 1

"""Settings of the controller: one frozen dataclass, each field with its unit and reason."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ControllerSettings:
    retry_delay_seconds: float = 30.0
    """Seconds before a ServingDeployment that could not be reconciled (a missing Secret) is
    tried again. 30 s: soon enough after the user creates the Secret, and a retry costs two
    GETs. Env: SLIPSTREAM_RETRY_DELAY_SECONDS."""

    status_interval_seconds: float = 30.0
    """Seconds between refreshes of phase and readiness from the engine Deployment. Engines
    take minutes to load weights, so 30 s loses nothing. Env: SLIPSTREAM_STATUS_INTERVAL_SECONDS."""

    metrics_port: int = 9090
    """Port of the operator's own Prometheus metrics (0: off). Env: SLIPSTREAM_METRICS_PORT."""

    @classmethod
    def from_env(cls) -> ControllerSettings:
        values = {}
        for field in fields(cls):
            raw = os.environ.get(f"SLIPSTREAM_{field.name.upper()}")
            if raw is not None:
                values[field.name] = type(getattr(cls(), field.name))(raw)
        return cls(**values)

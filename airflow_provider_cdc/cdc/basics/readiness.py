"""Is a source ready for the next window? The answer the sensors and their triggers share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Readiness:
    state: str  # "ready", "waiting", "failed"
    message: str
    pending_bytes: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)  # the sensor's XCom when ready

    def to_event(self) -> dict:
        status = {"ready": "success", "failed": "error"}.get(self.state, "waiting")
        return {"status": status, "message": self.message, "pending_bytes": self.pending_bytes, **self.detail}

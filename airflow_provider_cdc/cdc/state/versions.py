"""The versions of a Parquet sink's state tables: each a folded Parquet directory, recorded in the state log.

Versions are written under ``<state_path>/<topic dir>/version=<window id>-<attempt>/`` and recorded in
``<state_path>/_state_log/<prefix>/<topic dir>/<n>.json``, published with one conditional PUT on
an object store, as the commit log's entries are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from airflow_provider_cdc.cdc.basics.naming import Topic

STATE_LOG_DIR = "_state_log"


@dataclass(frozen=True)
class StateVersion:
    window_seq: int
    window_id: str
    path: str  # relative to the state path
    rows: int
    rebuilt: bool
    created_at_ms: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class StateResult:
    topic: str
    version: StateVersion | None
    applied_windows: tuple[str, ...]
    action: str  # "applied", "rebuilt", "unchanged", "empty"; lake tables: also "time_travel"
    detail: dict | None = None  # lake tables: what the MERGE did (merge.MergeResult)

    def to_dict(self) -> dict:
        return {
            "topic": self.topic,
            "action": self.action,
            "window_id": self.version.window_id if self.version else None,
            "rows": self.version.rows if self.version else 0,
            "path": self.version.path if self.version else None,
            "applied_windows": list(self.applied_windows),
            **({"merge": self.detail} if self.detail else {}),
        }


class StateLog:
    def __init__(self, storage: Any, topic_prefix: str, topic: Topic):
        self.storage = storage
        self.directory = f"{STATE_LOG_DIR}/{topic_prefix}/{topic.directory}"

    def versions(self) -> list[StateVersion]:
        names = [n for n in self.storage.list_names(self.directory) if n.endswith(".json") and not n.startswith(".")]
        return [StateVersion(**json.loads(self.storage.read_text(f"{self.directory}/{n}"))) for n in names]

    def current(self) -> StateVersion | None:
        current = [v for v in self.versions() if not v.rebuilt]
        return max(current, key=lambda v: v.window_seq) if current else None

    def append(self, version: StateVersion) -> None:
        names = [n for n in self.storage.list_names(self.directory) if n.endswith(".json") and not n.startswith(".")]
        seq = (int(names[-1][:-5]) + 1) if names else 1
        self.storage.publish_text(f"{self.directory}/{seq:020d}.json", json.dumps(version.to_dict()))

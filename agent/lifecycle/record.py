"""The typed deployment record: what each stage produced (Fetched, Verified, Qualified, Activated, Trial).

Each result is stored in the journal (Deployment.data) under the JSON keys the journal has always used, so
existing state dirs load unchanged; `Record` is the typed read of those keys for the stages that follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.lifecycle.journal import Deployment


@dataclass(frozen=True)
class Fetched:
    """DOWNLOADING: the artifact is in the content store (what the source returned: sha256, size)."""

    got: dict[str, Any] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        return {**self.got, "fetched": True}


@dataclass(frozen=True)
class Verified:
    """VERIFYING: the unpacked package (package_dir, model_path, model_sha256, ...)."""

    got: dict[str, Any]

    @property
    def package_dir(self) -> str:
        return str(self.got["package_dir"])

    def to_data(self) -> dict[str, Any]:
        return dict(self.got)


@dataclass(frozen=True)
class Qualified:
    """QUALIFYING: the decision's summary, the selected row (what activation serves) and the queue window."""

    decision: dict[str, Any]
    selected: dict[str, Any]
    qualification: dict[str, Any]

    def to_data(self) -> dict[str, Any]:
        return {"decision": self.decision, "selected": self.selected, "qualification": self.qualification}


@dataclass(frozen=True)
class Activated:
    """ACTIVATING: how the swap went; the shadow phase's figures (None: none ran) when a new version swapped."""

    swap: dict[str, Any] | None = None
    shadow: dict[str, Any] | None = None
    rehearsed: bool = False  # a new version's activation (the journal then holds "shadow", None or not)

    def to_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.swap is None else {"swap": self.swap}
        if self.rehearsed:
            out["shadow"] = self.shadow
        return out


@dataclass(frozen=True)
class Trial:
    """PROBATION: the verdict's figures, and the reason when it found trouble ("" when it passed)."""

    probation: dict[str, Any]
    reason: str = ""

    def to_data(self) -> dict[str, Any]:
        return {"probation": self.probation, **({"reason": self.reason} if self.reason else {})}


Result = Fetched | Verified | Qualified | Activated | Trial | None


class Record:
    """Typed read of what earlier stages journaled for one deployment (today's JSON keys, in one place)."""

    def __init__(self, dep: Deployment):
        self.data = dep.data

    @property
    def sha256(self) -> str | None:
        return self.data.get("sha256")

    @property
    def fetched(self) -> bool:
        return bool(self.data.get("fetched"))

    @property
    def manifest(self) -> dict[str, Any]:
        return self.data.get("manifest") or {}

    @property
    def artifact_sha256(self) -> str | None:
        return (self.manifest.get("artifact") or {}).get("sha256")

    @property
    def package_dir(self) -> str:
        return str(self.data["package_dir"])

    @property
    def model_sha256(self) -> str | None:
        return self.data.get("model_sha256")

    @property
    def overrides(self) -> Any:
        """The manifest's qualification overrides (None: the target's)."""
        return self.manifest.get("qualification")

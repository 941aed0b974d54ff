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
    """DOWNLOADING: the artifact is in the content store. What a source's fetch returns (its digest and size,
    and what the transfer moved: bytes_fetched, bytes_reused); empty when it was there already."""

    sha256: str | None = None
    size: int | None = None
    transfer: dict[str, int] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.sha256 is None else {"sha256": self.sha256, "size": self.size}
        return {**out, **self.transfer, "fetched": True}


@dataclass(frozen=True)
class Verified:
    """VERIFYING: the unpacked, checked package; its model signature's verdict where this device requires one."""

    package_dir: str
    model_path: str
    model_sha256: str
    model_signature: dict[str, Any] | None = None

    def to_data(self) -> dict[str, Any]:
        out = {"package_dir": self.package_dir, "model_sha256": self.model_sha256, "model_path": self.model_path}
        return out if self.model_signature is None else {**out, "model_signature": self.model_signature}


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

"""InboxSource: the local-mode DeploymentSource (agent.lifecycle.ports): state_dir/inbox/<model>/<version>/."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle import actions as act
from agent.lifecycle.journal import Deployment, Journal
from agent.names import is_valid_name


class InboxSource:
    """state_dir/inbox/<model>/<version>/ directories (local mode): trusted by filesystem permissions."""

    kind = "inbox"

    def __init__(self, store: Any, journal: Journal, staging: Path) -> None:
        self.store, self.journal, self.staging = store, journal, staging
        self._warned: set[str] = set()

    def ready(self) -> bool:
        return True

    def check(self, dep: Deployment) -> None:
        if not dep.data.get("sha256") and not Path(dep.source["path"]).is_dir():
            raise LifecycleError(f"inbox package {dep.source['path']} disappeared")

    def fetch(self, dep: Deployment, ctx: act.StepContext) -> dict[str, Any]:
        src = Path(dep.source["path"])
        got = act.fetch_inbox(src, self.store, self.staging, ctx)
        dep.data.update(got, fetched=True)
        self.journal.save(dep)  # the blob is safe in the store before the inbox copy goes
        shutil.rmtree(src, ignore_errors=True)
        return {}

    def scan(
        self, inbox: Path, claimed: set[str | None], submit: Callable[..., Any], warn: Callable[[str, str], None]
    ) -> None:
        """Submit every complete inbox/<model>/<version>/ not claimed by an in-flight deployment."""
        for model_dir in sorted(inbox.iterdir()):
            if model_dir.name.startswith(".") or not model_dir.is_dir():
                continue
            for version_dir in sorted(model_dir.iterdir()):
                if version_dir.name.startswith(".") or not version_dir.is_dir() or str(version_dir) in claimed:
                    continue
                if not (is_valid_name(model_dir.name) and is_valid_name(version_dir.name)):
                    if str(version_dir) not in self._warned:
                        self._warned.add(str(version_dir))
                        warn(
                            str(version_dir),
                            "inbox entry ignored: model and version directory names "
                            "must match [A-Za-z0-9][A-Za-z0-9._-]{0,63}",
                        )
                    continue
                submit(model_dir.name, version_dir.name, {"kind": "inbox", "path": str(version_dir)})

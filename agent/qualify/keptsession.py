"""In a kept row worker (agent.qualify.keptrows): the row's warm session and what it was opened for (file,
provider, precision, device, cache), until the close-call confirmation round re-times it in this process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_KEPT: dict[str, Any] = {}


def keeper(what: tuple[Any, ...]) -> Callable[[Any], None]:
    """keep(session): hold it for exactly `what` (closing the one held before)."""

    def keep(sess: Any) -> None:
        old = _KEPT.pop("session", None)
        if old is not None:
            old.close()
        _KEPT.update(session=sess, what=what)

    return keep


def holds() -> bool:
    return "session" in _KEPT


def take(what: tuple[Any, ...]) -> Any:
    """The session this worker kept for exactly this row, or None."""
    if _KEPT.get("what") != what:
        return None
    _KEPT.pop("what")
    return _KEPT.pop("session", None)

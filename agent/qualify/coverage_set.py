"""Which providers a qualification measures: every available one. The target's list orders near-ties
(agent.qualify.select) and may exclude a provider only with a stated reason (`exclude:` on its entry),
which the row shows; a provider the target does not list is measured when its probe says available."""

from __future__ import annotations

from typing import Any

from agent.qualify.decision import Row


def with_unlisted(preference: list[str]) -> list[str]:
    """The target's order, then every other known provider (measured only where available)."""
    from agent.providers import PROVIDER_NAMES

    return list(dict.fromkeys([*preference, *PROVIDER_NAMES]))


def exclusion(target: Any, name: str) -> str | None:
    """The target's stated reason for never measuring `name`, if it gives one."""
    for pref in getattr(target, "providers", None) or []:
        if getattr(pref, "name", None) == name and getattr(pref, "exclude", None):
            return str(pref.exclude)
    return None


def excluded_row(target: Any, name: str, reason: str) -> Row:
    return Row(
        provider=name,
        status="unavailable",
        stage="target",
        reason=f"excluded by the {getattr(target, 'name', '?')} target: {reason}",
    )

"""The one YAML loader the product uses for what it is given (agent.yaml, model.yaml, targets, overrides):
safe tags only, a size cap, and aliases refused, so a few kilobytes cannot expand into gigabytes
("billion laughs"). Errors are the caller's domain error, naming the file and the line."""

from __future__ import annotations

import os
from typing import Any

import yaml

from agent.util.textfile import MAX_TEXT_BYTES, decode, read_text


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (`*name`): anchors alone are harmless, expansion is what costs."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, f"alias *{event.anchor} refused (aliases are not allowed)", event.start_mark
            )
        return super().compose_node(parent, index)


def loads(text: str | bytes, where: str, error: type[Exception], *, max_bytes: int = MAX_TEXT_BYTES) -> Any:
    """Parse `text` (str or UTF-8 bytes); `error(where: line L column C: problem)` on any failure."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > max_bytes:
            raise error(f"{where}: over {max_bytes} bytes; refusing to parse it")
        text = decode(bytes(text), where, error)
    elif len(text) > max_bytes:
        raise error(f"{where}: over {max_bytes} characters; refusing to parse it")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise error(f"{where}:{at} invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply") from None


def load_file(
    path: str | os.PathLike[str], what: str, error: type[Exception], *, max_bytes: int = MAX_TEXT_BYTES
) -> Any:
    """Read (bounded, UTF-8) and parse the YAML file at `path`; `what` names it in errors."""
    return loads(read_text(path, what, error, max_bytes=max_bytes), f"{what}: {path}", error, max_bytes=max_bytes)

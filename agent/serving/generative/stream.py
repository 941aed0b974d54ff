"""A response body streamed from a generation: iterating gives the SSE bytes; close() (the HTTP front calls it when
the stream ends or the client goes away) ends the generation and releases its KV lease even if it never started."""

from __future__ import annotations

from collections.abc import Generator, Iterator

from agent.serving.generative.kvbudget import Lease


class GenerationStream:
    def __init__(self, events: Generator[bytes, None, None], pieces: Generator[str, None, None], lease: Lease) -> None:
        self.events, self.pieces, self.lease = events, pieces, lease

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self.events)

    def close(self) -> None:
        try:
            self.events.close()
            self.pieces.close()
        finally:
            self.lease.release()


def drain(pieces: Generator[str, None, None], lease: Lease) -> str:
    """The whole text of a generation that is not streamed (its lease released however it ends)."""
    try:
        return "".join(pieces)
    finally:
        pieces.close()
        lease.release()

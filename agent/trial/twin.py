"""A second session of the version the clients are running, for the pairs only (serving.probation.paired_twin).

A session that several client threads run on both cores runs faster alone afterwards than one that only the
pair thread runs: measured in the pairs on this project's Intel Xeon, an equal-compute copy served by four
clients read x0.72 against its incumbent, the incumbent served x1.22, a third session served x1.00 (docs/serving.md,
"A version the clients serve"). So the served side of a pair is timed on a twin the clients never run: the
serving version's model opened again, as its slot entry says (a generative version: loaded again by its runtime,
genprobation.py). It is built on the pair thread before the first
pair (the run gate measures nothing meanwhile: a build's CPU would count in the runs it overlaps), costs one more
copy of the model in memory for the trial, and is closed when the pairs stop. A twin that cannot be built leaves
the serving session in the pairs and says why."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

INCUMBENT, CANDIDATE = "incumbent", "candidate"


class Twin:
    """Builds, holds and closes the twin of one side of a pairing (`side`: INCUMBENT or CANDIDATE)."""

    def __init__(self, side: str, build: Callable[[], Any], gate: Any = None) -> None:
        """gate: the run gate told to measure nothing while the twin builds (None: a pairing that times its runs
        on its own, genpaired.TokenPairing)."""
        if side not in (INCUMBENT, CANDIDATE):
            raise ValueError(f"twin side must be {INCUMBENT!r} or {CANDIDATE!r}, got {side!r}")
        self.side, self._build, self._gate = side, build, gate
        self.session: Any = None
        self.build_s: float | None = None
        self.error: str | None = None

    def open(self) -> Any:
        """The twin session, built now (None when the build failed: `error` says why)."""
        t0 = time.perf_counter()
        if self._gate is not None:
            self._gate.busy(True)
        try:
            self.session = self._build()
        except Exception as exc:  # noqa: BLE001 - the pairs go on with the serving session, saying why
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            if self._gate is not None:
                self._gate.busy(False)
            self.build_s = round(time.perf_counter() - t0, 4)
        return self.session

    def close(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            try:
                session.close()
            except Exception:  # noqa: BLE001 - closing a twin nobody serves from cannot hurt a client
                pass

    def said(self) -> dict[str, Any]:
        """{"side", "built", "build_s", "error"}: what `paired_runs.twin` reports."""
        built = self.error is None and self.build_s is not None
        return {"side": self.side, "built": built, "build_s": self.build_s, "error": self.error}

"""What a worker process and its parent's runner share without importing each other: the connection a task
reports through, the test-only fault hook's variable, and how "module:function" resolves."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

FAULT_ENV = "EDGE_AGENT_TEST_WORKER_FAULT"  # test-only: "abort[:tag]" or "hang[:tag]"
CHILD_CONN: list[Connection] = []  # set inside a worker process (agent.isolate.worker)


def resolve(func: str) -> Callable[..., Any]:
    module, name = func.split(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn

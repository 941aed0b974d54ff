"""The daemon's services: small parts that agent.app wires and drives from its loop (one `tick()` a turn).

Each gets its collaborators injected (orchestrator, registry, the link's publish functions, an emit callback)
and never reaches into the DeviceAgent: inbox (InboxScanner), control (ControlService), health
(HealthPublisher), probe (ProviderProbeService), report (Reporter: lifecycle transitions and rejections),
status (StatusWriter: status.json with the disk-full degrade, published) and cpsync (ControlPlaneSync: enrollment
and decision records to the control plane, on its own thread through an injected port).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Emit = Callable[[dict[str, Any]], None]  # the daemon's event sink (a log line each)
Publish = Callable[[dict[str, Any]], None]  # one document out over the link (status, event, health)

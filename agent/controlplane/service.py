"""Composition of the control-plane service: database (migrated), first-start import, the admin token, the
fleet loop, and the ASGI app (API + dashboard) that uvicorn serves."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import func, select
from starlette.exceptions import HTTPException as StarletteHTTPException

from agent.controlplane import db, repo, tokens
from agent.controlplane.alert_monitor import AlertMonitor
from agent.controlplane.enroll import EnrollRefused
from agent.controlplane.importer import import_store
from agent.controlplane.lease import Lease
from agent.controlplane.limits import BodyLimit, body_cap
from agent.controlplane.models import OperatorToken
from agent.controlplane.ratelimit import Guard, shared_limiter
from agent.controlplane.settings import Settings, loopback
from agent.errors import ConfigError, EdgeAgentError

log = logging.getLogger("edge_agent.controlplane")
OPENAPI_PATH = "/api/openapi.json"


class ControlPlane:
    """What the routes share: settings, the session factory, the fleet loop (None without a broker)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.engine = db.make_engine(settings.database_url)
        db.migrate(self.engine)
        self.factory = db.sessions(self.engine)
        self.lease = Lease(self.engine, settings.lease_s)  # the rollout leader's lease (agent.controlplane.lease)
        self.role: Any = None  # agent.controlplane.leader.FleetRole, with a broker
        self.stopping = threading.Event()
        self.imported: dict[str, int] = {}
        self.admin_token: str | None = None
        self.guard = Guard(settings.limits, shared_limiter(self.factory, self.engine))  # rate limits, pending cap
        self.alerts = AlertMonitor(self.factory, settings)  # alerts, the webhook, telemetry retention (leader only)
        self.alerts.leading = lambda: self.role is None or self.role.loop is not None

    def prepare(self) -> "ControlPlane":
        with db.write(self.factory) as s:
            db.serialize(s, "prepare")  # replicas starting at once: one imports and makes the admin token
            self.imported = import_store(s, self.settings.store)
            if (s.scalar(select(func.count()).select_from(OperatorToken)) or 0) == 0:
                self.admin_token = tokens.create_operator(s, "admin", "admin")
                repo.audit(s, "service", "token.create", "admin", role="admin")
        if self.admin_token and self.settings.admin_token_file is not None:
            path = self.settings.admin_token_file
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.admin_token + "\n")
        return self

    def start_fleet(self) -> None:
        """The fleet side (artifact server; the fleet loop on the replica holding the leader lease). A broker
        that does not answer does not stop the service: the API and dashboard serve (the pages show why the
        fleet link is down) while a thread retries."""
        self.alerts.start()
        if not self.settings.broker_url:
            return
        from agent.controlplane.leader import FleetRole

        key = None
        if self.settings.signing_key is not None:
            from agent.artifacts.keys import load_private_key

            key = load_private_key(self.settings.signing_key)  # a bad key is a config error: fail at start
        self.role = FleetRole(self.factory, self.settings, self.lease, key).start()

    @property
    def loop(self) -> Any:
        return self.role.loop if self.role is not None else None

    @property
    def artifacts(self) -> Any:
        return self.role.artifacts if self.role is not None else None

    @property
    def fleet_error(self) -> str | None:
        return self.role.error if self.role is not None else None

    def stop(self) -> None:
        self.stopping.set()
        self.alerts.stop()
        if self.role is not None:
            self.role.stop()
        if (close := getattr(self.guard.limiter, "close", None)) is not None:
            close()  # the database limiter's own connection
        self.engine.dispose()

    def registry_changed(self, *device_ids: str) -> None:
        """The registry entries of these devices changed (none named: any may have)."""
        if self.loop is None:
            return
        if device_ids:
            self.loop.devices_changed(device_ids)
        else:
            self.loop.registry_dirty.set()

    def wake(self) -> None:
        if self.loop is not None:
            self.loop.wake.set()

    def loop_state(self) -> dict[str, Any]:
        if self.loop is None:
            why = self.fleet_error or "no mqtt.url configured: no device status, no rollouts"
            if self.role is not None and not self.fleet_error:
                holder = self.lease.state().get("holder") or "no replica yet"
                why = f"standby: {holder} leads the rollouts and the MQTT fan-out (leader lease)"
                return {"running": False, "standby": True, "why": why, "alerts": self.alerts.active}
            return {"running": False, "why": why, "alerts": self.alerts.active}
        return {"running": True, "error": self.loop.error, "alerts": self.alerts.active}

    def leader_state(self) -> dict[str, Any]:
        """/api/v1/health's `leader` (agent.controlplane.leader)."""
        if self.role is not None:
            return self.role.state()
        out = self.lease.state()
        out.update(leading=False, why="no mqtt.url configured: no fleet loop to lead")
        return out


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(cp: ControlPlane) -> FastAPI:
    from agent.controlplane import observe_api, observe_web
    from agent.controlplane.api import router
    from agent.controlplane.releases import router as releases_router
    from agent.controlplane.security import BrowserGuard
    from agent.controlplane.sessions import Sessions
    from agent.controlplane.web import router as web_router
    from agent.controlplane.web import static_files
    from agent.controlplane.webaudit import router as audit_router
    from agent.controlplane.webdevices import router as devices_router
    from agent.controlplane.webmodels import router as models_router

    app = FastAPI(
        title="edge-agent control plane",
        version="1",
        openapi_url=OPENAPI_PATH,
        docs_url=None,  # the Swagger UI loads from a CDN: not served
        redoc_url=None,
    )
    app.state.cp = cp
    app.state.sessions = Sessions(cp.factory)
    app.add_middleware(BrowserGuard)
    app.include_router(router)
    app.include_router(releases_router)  # agent releases (kind: agent)
    app.include_router(web_router)
    for extra in (devices_router, models_router, audit_router):  # the dashboard's other pages
        app.include_router(extra)
    app.include_router(observe_web.router)
    app.include_router(observe_api.router)
    app.mount("/static", static_files(), name="static")
    app.add_middleware(BodyLimit, cap_for=lambda m, p: body_cap(cp.settings.limits, cp.settings.max_body_bytes, m, p))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        fields = []
        for e in exc.errors():
            loc = [str(p) for p in e.get("loc", ()) if p not in ("body", "query", "path")]
            fields.append({"field": ".".join(loc) or "body", "message": e.get("msg")})
        msg = "; ".join(f"{f['field']}: {f['message']}" for f in fields)
        return JSONResponse({"error": msg, "fields": fields}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(EdgeAgentError)
    async def _domain(request: Request, exc: EdgeAgentError) -> JSONResponse:
        if isinstance(exc, db.StorageError):
            return _error(507, str(exc))
        if isinstance(exc, repo.NotFound):
            return _error(404, str(exc))
        if isinstance(exc, repo.Conflict):
            return _error(409, str(exc))
        if isinstance(exc, EnrollRefused):
            return _error(403, str(exc))
        if isinstance(exc, ConfigError):
            return _error(400, str(exc))
        return _error(422, str(exc))

    return app


def server(cp: ControlPlane, port: int | None = None):
    """A uvicorn server for the app (run() blocks; SIGTERM/SIGINT stop it)."""
    import uvicorn

    st = cp.settings
    port = st.port if port is None else port
    tls: dict[str, Any] = {}
    if st.tls_certfile is not None:
        check_tls(st)
        tls = {"ssl_certfile": str(st.tls_certfile), "ssl_keyfile": str(st.tls_keyfile)}
    elif st.allow_insecure and not loopback(st.host):
        log.warning(
            "listen.allow_insecure: serving PLAIN HTTP on %s:%d beyond loopback; only safe behind a TLS-terminating "
            "proxy on a network no one else reaches (docs/control-plane.md, Running behind TLS)",
            st.host,
            port,
        )
    config = uvicorn.Config(create_app(cp), host=st.host, port=port, log_level="warning", **tls)
    return uvicorn.Server(config)


def check_tls(settings: Settings) -> None:
    """The certificate and key load (ConfigError naming the key otherwise, before uvicorn starts)."""
    import ssl

    for key, path in (("tls.certfile", settings.tls_certfile), ("tls.keyfile", settings.tls_keyfile)):
        if path is None or not os.access(path, os.R_OK):
            raise ConfigError(f"{key}: {path} is missing or not readable")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(str(settings.tls_certfile), str(settings.tls_keyfile))
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(
            f"tls.certfile: {settings.tls_certfile} with tls.keyfile {settings.tls_keyfile}: {exc}"
        ) from None


def serve(settings: Settings, ready: threading.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT."""
    if settings.tls_certfile is not None:
        check_tls(settings)  # before the database and the fleet link: a bad certificate changes nothing
    import signal

    cp = ControlPlane(settings).prepare()
    cp.start_fleet()
    if threading.current_thread() is threading.main_thread():
        # uvicorn stops gracefully on SIGTERM, then raises the signal again under the handler it found: with the
        # default one the process would die there, before cp.stop() (the leader lease released, the loop flushed)
        signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server(cp).run()
    finally:
        cp.stop()

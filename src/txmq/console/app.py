"""The console's aiohttp application: sessions, CSRF, the audit log, the pages and the in-memory history."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from txmq.acl import permission as perm
from txmq.acl.decision import AclState
from txmq.client import Admin
from txmq.console import pages
from txmq.errors import TxmqError
from txmq.protocol.topics import RETRY_GROUP_TOPIC_PREFIX

log = logging.getLogger("txmq.console")
audit = logging.getLogger("txmq.console.audit")

SESSION_COOKIE = "txmq_session"
LOGIN_CSRF_COOKIE = "txmq_login_csrf"
SESSION_SECONDS = 8 * 3600
MAX_CHART_GROUPS = 50  # groups whose lag is sampled for the charts (the largest lags first)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class ConsoleSettings:
    namesrv: str
    host: str = "127.0.0.1"
    port: int = 8080  # 0 picks a free port
    # The console's own account toward the brokers when they check ACL (txmq's admin codes need an admin account).
    access_key: str | None = None
    secret_key: str | None = None
    # Who may log in: the current ACL state (None: ACL is off, no login, everyone on the loopback may act).
    acl: Callable[[], AclState] | None = None
    sample_seconds: float = 10.0
    history_seconds: float = 3600.0


@dataclass(slots=True)
class Session:
    user: str
    role: str  # "admin" or "reader"
    csrf: str
    expires: float
    remote: str = ""

    @property
    def admin(self) -> bool:
        return self.role == "admin"


def account_role(state: AclState, access_key: str, secret_key: str) -> str | None:
    """``admin``, ``reader`` (an account with SUB rights somewhere) or None (unknown, wrong secret, no SUB)."""
    account = state.accounts.get(access_key)
    if account is None:
        hmac.compare_digest(b"x" * 16, secret_key.encode())  # same work whether or not the account exists
        return None
    if not hmac.compare_digest(account.secret_key.encode(), secret_key.encode()):
        return None
    if account.admin:
        return "admin"
    rights = [account.default_topic_perm, account.default_group_perm, *account.resource_perms.values()]
    if any(bits & perm.SUB for bits in rights):
        return "reader"
    return None


class History:
    """Samples for the charts, kept in memory for ``seconds``: throughput (messages put and got per second over
    the cluster) and each consumer group's lag."""

    def __init__(self, seconds: float, every: float) -> None:
        size = max(2, int(seconds / max(every, 0.1)) + 1)
        self.throughput: collections.deque[tuple[float, float, float]] = collections.deque(maxlen=size)
        self.lag: dict[str, collections.deque[tuple[float, int]]] = {}
        self._size = size
        self._last_totals: tuple[float, int, int] | None = None

    def add_totals(self, now: float, put_total: int, get_total: int) -> None:
        last = self._last_totals
        self._last_totals = (now, put_total, get_total)
        if last is None or now <= last[0]:
            return
        span = now - last[0]
        self.throughput.append((now, max(0, put_total - last[1]) / span, max(0, get_total - last[2]) / span))

    def add_lag(self, now: float, group: str, lag: int) -> None:
        series = self.lag.get(group)
        if series is None:
            series = self.lag[group] = collections.deque(maxlen=self._size)
        series.append((now, lag))


class Console:
    """``await start()`` serves the console; ``await close()`` stops it."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self.admin = Admin(
            settings.namesrv,
            instance_name=f"txmq-console-{secrets.token_hex(4)}",
            **(
                {"access_key": settings.access_key, "secret_key": settings.secret_key}
                if settings.access_key and settings.secret_key
                else {}
            ),
        )
        self.sessions: dict[str, Session] = {}
        self._anon_csrf = secrets.token_urlsafe(24)
        self.history = History(settings.history_seconds, settings.sample_seconds)
        self.port = settings.port
        self._runner: web.AppRunner | None = None
        self._sampler: asyncio.Task[None] | None = None
        self.app = self._build()

    @property
    def acl_on(self) -> bool:
        return self.settings.acl is not None

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.admin.start()
        runner = web.AppRunner(self.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.settings.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            await self.admin.shutdown()
            raise OSError(
                exc.errno,
                f"the console's port {self.settings.host}:{self.settings.port} cannot be bound ({exc.strerror})",
            ) from exc
        self._runner = runner
        self.port = runner.addresses[0][1]
        self._sampler = asyncio.create_task(self._sample_loop(), name="console-history")
        log.info("console on http://%s:%d/ (namesrv %s)", self.settings.host, self.port, self.settings.namesrv)

    async def close(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.admin.shutdown()

    # -- the application ------------------------------------------------------------------------------------------

    def _build(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        r = app.router
        r.add_get("/login", self.login_page)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/static/{name}", self.static)
        views = pages.Views(self)
        r.add_get("/", views.cluster)
        r.add_get("/topics", views.topics)
        r.add_get("/topics/{topic}", views.topic)
        r.add_get("/groups", views.groups)
        r.add_get("/groups/{group}", views.group)
        r.add_post("/groups/{group}/reset", views.reset_offset)
        r.add_get("/transactions", views.transactions)
        r.add_get("/transactions/{ident}", views.transaction)
        r.add_post("/transactions/{ident}/resolve", views.resolve)
        r.add_get("/dlq", views.dlq)
        r.add_post("/dlq/resend", views.resend)
        r.add_get("/message", views.message)
        r.add_get("/api/history", views.history)
        return app

    STATIC = {
        "uPlot.iife.min.js": "application/javascript",
        "uPlot.min.css": "text/css",
        "uPlot.LICENSE": "text/plain",
        "console.js": "application/javascript",
        "console.css": "text/css",
    }

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        kind = self.STATIC.get(name)
        if kind is None:
            raise web.HTTPNotFound()
        data = resources.files("txmq.console").joinpath("static", name).read_bytes()
        return web.Response(body=data, content_type=kind, headers={"Cache-Control": "max-age=3600"})

    def session_of(self, request: web.Request) -> Session | None:
        if not self.acl_on:
            return Session("anonymous", "admin", self._anonymous_csrf(), float("inf"), request.remote or "")
        token = request.cookies.get(SESSION_COOKIE)
        session = self.sessions.get(token or "")
        if session is None or session.expires < time.monotonic():
            if token:
                self.sessions.pop(token, None)
            return None
        return session

    def _anonymous_csrf(self) -> str:
        # Without ACL there is no login; a per-console token still keeps other sites from posting to it.
        return self._anon_csrf

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        who = "-"
        status = 500
        try:
            if path.startswith("/static/") or path == "/login":
                response = await handler(request)
                status = response.status
                return response
            session = self.session_of(request)
            if session is None:
                who = "(not logged in)"
                if request.method == "GET":
                    raise web.HTTPFound("/login")
                raise web.HTTPForbidden(text="log in first")
            who = f"{session.user}@{request.remote}"
            request["session"] = session
            if request.method == "POST":
                form = await request.post()
                if not hmac.compare_digest(str(form.get("csrf", "")), session.csrf):
                    raise web.HTTPForbidden(text="the form's CSRF token is missing or stale: reload the page")
                if path != "/logout" and not session.admin:
                    raise web.HTTPForbidden(
                        text=f"{session.user} may read but not change anything: an admin account is needed"
                    )
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            detail = request.get("audit", "")
            audit.info("who=%s %s %s -> %d%s", who, request.method, request.path_qs, status, detail)

    # -- login ----------------------------------------------------------------------------------------------------

    async def login_page(self, request: web.Request, problem: str = "") -> web.StreamResponse:
        if not self.acl_on:
            raise web.HTTPFound("/")
        token = request.cookies.get(LOGIN_CSRF_COOKIE) or secrets.token_urlsafe(24)
        response = web.Response(text=pages.login_html(token, problem), content_type="text/html")
        response.set_cookie(LOGIN_CSRF_COOKIE, token, httponly=True, samesite="Strict")
        if problem:
            response.set_status(403)
        return response

    async def login(self, request: web.Request) -> web.StreamResponse:
        if not self.acl_on:
            raise web.HTTPFound("/")
        form = await request.post()
        cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        if not cookie or not hmac.compare_digest(str(form.get("csrf", "")), cookie):
            raise web.HTTPForbidden(text="the login form's CSRF token is missing or stale: reload the page")
        access_key = str(form.get("accessKey", "")).strip()
        secret_key = str(form.get("secretKey", ""))
        assert self.settings.acl is not None
        role = account_role(self.settings.acl(), access_key, secret_key)
        audit.info("who=%s@%s login -> %s", access_key or "(empty)", request.remote, role or "refused")
        if role is None:
            return await self.login_page(
                request, "Unknown accessKey, wrong secretKey, or an account without SUB rights."
            )
        token = secrets.token_urlsafe(32)
        self.sessions[token] = Session(
            access_key, role, secrets.token_urlsafe(24), time.monotonic() + SESSION_SECONDS, request.remote or ""
        )
        response = web.HTTPFound("/")
        response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="Strict")
        raise response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        token = request.cookies.get(SESSION_COOKIE)
        if token:
            self.sessions.pop(token, None)
        response = web.HTTPFound("/login" if self.acl_on else "/")
        response.del_cookie(SESSION_COOKIE)
        raise response

    # -- history --------------------------------------------------------------------------------------------------

    async def sample(self) -> None:
        """One sample of the cluster's throughput and of each group's lag."""
        now = time.time()
        admin = self.admin
        put_total = get_total = 0
        for addr in (await admin.cluster_info()).master_addrs():
            info = await admin.broker_runtime_info(addr)
            put_total += int(info.get("msgPutTotalTodayNow", 0) or 0)
            get_total += int(info.get("msgGetTotalTodayNow", 0) or 0)
        self.history.add_totals(now, put_total, get_total)
        lags = []
        for group in await self.groups():
            try:
                lags.append((await admin.consume_stats(group)).diff_total)
            except TxmqError:
                lags.append(-1)
        kept = sorted(zip(await self.groups(), lags, strict=False), key=lambda g: -g[1])[:MAX_CHART_GROUPS]
        for group, lag in kept:
            if lag >= 0:
                self.history.add_lag(now, group, lag)

    async def _sample_loop(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception as exc:  # a broker away for a while must not end the charts
                log.warning("console sample failed: %s", exc)
            await asyncio.sleep(self.settings.sample_seconds)

    async def groups(self) -> list[str]:
        """Consumer groups: every group has its %RETRY% topic once a consumer of it has been seen."""
        return sorted(
            t[len(RETRY_GROUP_TOPIC_PREFIX) :]
            for t in await self.admin.topic_list()
            if t.startswith(RETRY_GROUP_TOPIC_PREFIX)
        )

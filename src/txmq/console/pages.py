"""The console's pages: each one a few :class:`txmq.client.Admin` calls rendered as HTML (every value escaped)."""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from txmq.client.admin import looks_like_offset_msg_id
from txmq.errors import MQBrokerError, TxmqError
from txmq.protocol.codes import ResponseCode
from txmq.protocol.record import Prop
from txmq.protocol.topics import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    TRANS_CHECK_MAX_TIME_TOPIC,
)

if TYPE_CHECKING:
    from txmq.console.app import Console, Session

audit = logging.getLogger("txmq.console.audit")

NAV = (
    ("/", "Cluster"),
    ("/topics", "Topics"),
    ("/groups", "Consumer groups"),
    ("/transactions", "Transactions"),
    ("/dlq", "Dead letters"),
    ("/message", "Message lookup"),
)
# Properties never shown: none carries a secret today, but ACL fields must never reach a page if a client sent one.
HIDDEN_PROPERTIES = frozenset({"AccessKey", "Signature", "SecurityToken", "secretKey", "SecretKey"})


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def when(ms: Any) -> str:
    try:
        value = int(ms)
    except (TypeError, ValueError):
        return ""
    if value <= 0:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value / 1000))


def age(ms: Any) -> str:
    try:
        seconds = int(ms) // 1000
    except (TypeError, ValueError):
        return ""
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "") -> str:
    """Rows are already-escaped HTML cells."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">nothing here</td></tr>'
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def link(href: str, text: Any) -> str:
    return f'<a href="{e(href)}">{e(text)}</a>'


def q(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def layout(title: str, body: str, session: Session | None, *, flash: str = "", ok: bool = True) -> str:
    nav = "".join(link(href, text) for href, text in NAV)
    user = ""
    if session is not None:
        user = (
            f'<span class="user">{e(session.user)} ({e(session.role)})</span>'
            f'<form method="post" action="/logout" class="inline"><input type="hidden" name="csrf" '
            f'value="{e(session.csrf)}"><button>Log out</button></form>'
            if session.user != "anonymous"
            else '<span class="user">ACL off: no login</span>'
        )
    note = f'<p class="flash {"ok" if ok else "bad"}">{e(flash)}</p>' if flash else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{e(title)} - txmq console</title>
<link rel="stylesheet" href="/static/uPlot.min.css"><link rel="stylesheet" href="/static/console.css">
<script src="/static/uPlot.iife.min.js"></script><script src="/static/console.js"></script></head>
<body><header><b>txmq</b> {nav} {user}</header><main><h1>{e(title)}</h1>{note}{body}</main></body></html>"""


def login_html(csrf: str, problem: str) -> str:
    note = f'<p class="flash bad">{e(problem)}</p>' if problem else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Log in - txmq console</title>
<link rel="stylesheet" href="/static/console.css"></head>
<body><main class="login"><h1>txmq console</h1>{note}
<form method="post" action="/login">
<input type="hidden" name="csrf" value="{e(csrf)}">
<label>accessKey <input name="accessKey" id="accessKey" autocomplete="username"></label>
<label>secretKey <input name="secretKey" id="secretKey" type="password" autocomplete="current-password"></label>
<button id="login">Log in</button></form>
<p class="hint">An account of plain_acl.yml: one with SUB rights may read, an admin account may also change.</p>
</main></body></html>"""


def csrf_field(session: Session) -> str:
    return f'<input type="hidden" name="csrf" value="{e(session.csrf)}">'


def confirm_box(text: str) -> str:
    return f'<label class="confirm"><input type="checkbox" name="confirm" value="yes" required> {e(text)}</label>'


def is_system(topic: str) -> bool:
    return (
        topic.lower().startswith(SYSTEM_TOPIC_PREFIX)
        or topic in (SCHEDULE_TOPIC, TRANS_CHECK_MAX_TIME_TOPIC, "TBW102", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC")
        or topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX))
    )


class Views:
    def __init__(self, console: Console) -> None:
        self.console = console

    @property
    def admin(self) -> Any:
        return self.console.admin

    def page(self, request: web.Request, title: str, body: str, *, flash: str = "", ok: bool = True) -> web.Response:
        return web.Response(
            text=layout(title, body, request.get("session"), flash=flash, ok=ok), content_type="text/html"
        )

    def failed(self, request: web.Request, title: str, exc: Exception, status: int = 502) -> web.Response:
        response = self.page(request, title, "", flash=f"{type(exc).__name__}: {exc}", ok=False)
        response.set_status(status)
        return response

    # -- cluster --------------------------------------------------------------------------------------------------

    async def cluster(self, request: web.Request) -> web.Response:
        try:
            info = await self.admin.cluster_info()
            rows = []
            for cluster, names in sorted(info.clusters.items()):
                for name in names:
                    for broker_id, addr in sorted(info.broker_addrs.get(name, {}).items()):
                        try:
                            rt = await self.admin.broker_runtime_info(addr)
                        except TxmqError as exc:
                            rt = {"brokerVersionDesc": f"unreachable: {exc}"}
                        rows.append(
                            [
                                e(cluster),
                                e(name),
                                e(broker_id),
                                e(addr),
                                e(rt.get("brokerVersionDesc", "")),
                                e(rt.get("msgPutTotalTodayNow", "")),
                                e(rt.get("msgGetTotalTodayNow", "")),
                                e(rt.get("commitLogMaxOffset", "")),
                                e(rt.get("tx.inDoubt", "")),
                                e(rt.get("runtime", "")),
                            ]
                        )
        except TxmqError as exc:
            return self.failed(request, "Cluster", exc)
        body = table(
            [
                "cluster",
                "broker",
                "id",
                "address",
                "version",
                "messages put",
                "messages got",
                "commit log end",
                "in doubt",
                "up",
            ],
            rows,
        )
        body += '<h2>Throughput, last hour</h2><div class="chart" id="throughput-chart" data-series="throughput"></div>'
        return self.page(request, "Cluster", body)

    # -- topics ---------------------------------------------------------------------------------------------------

    async def topics(self, request: web.Request) -> web.Response:
        show_all = request.query.get("all") == "1"
        try:
            names = sorted(await self.admin.topic_list())
        except TxmqError as exc:
            return self.failed(request, "Topics", exc)
        shown = [t for t in names if show_all or not is_system(t)]
        toggle = (
            link("/topics", "hide system, retry and DLQ topics")
            if show_all
            else link("/topics?all=1", "show system, retry and DLQ topics too")
        )
        rows = [[link(f"/topics/{q(t)}", t)] for t in shown]
        return self.page(request, "Topics", f"<p>{len(shown)} topics. {toggle}</p>" + table(["topic"], rows))

    async def topic(self, request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        try:
            stats = await self.admin.topic_stats(topic)
        except TxmqError as exc:
            return self.failed(request, f"Topic {topic}", exc, 404)
        rows = [
            [e(mq.broker_name), e(mq.queue_id), e(s.min_offset), e(s.max_offset), e(when(s.last_update_timestamp))]
            for mq, s in sorted(stats.items(), key=lambda kv: (kv[0].broker_name, kv[0].queue_id))
        ]
        total = sum(s.max_offset - s.min_offset for s in stats.values())
        body = f"<p>{total} messages held over {len(rows)} queues.</p>" + table(
            ["broker", "queue", "min offset", "max offset", "last stored"], rows
        )
        return self.page(request, f"Topic {topic}", body)

    # -- consumer groups ------------------------------------------------------------------------------------------

    async def groups(self, request: web.Request) -> web.Response:
        try:
            groups = await self.console.groups()
            rows = []
            for group in groups:
                try:
                    stats = await self.admin.consume_stats(group)
                    topics = sorted({mq.topic for mq in stats.offset_table})
                    lag = str(stats.diff_total)
                except TxmqError as exc:
                    topics, lag = [], f"({exc})"
                rows.append(
                    [
                        link(f"/groups/{q(group)}", group),
                        ", ".join(e(t) for t in topics if not t.startswith(RETRY_GROUP_TOPIC_PREFIX)),
                        e(lag),
                        link(f"/dlq?group={q(group)}", "dead letters"),
                    ]
                )
        except TxmqError as exc:
            return self.failed(request, "Consumer groups", exc)
        body = table(["group", "topics", "lag (messages)", ""], rows, cls="groups")
        return self.page(request, "Consumer groups", body)

    async def group(self, request: web.Request, *, flash: str = "", ok: bool = True) -> web.Response:
        group = request.match_info["group"]
        try:
            stats = await self.admin.consume_stats(group)
        except TxmqError as exc:
            return self.failed(request, f"Group {group}", exc, 404)
        rows = [
            [
                e(mq.topic),
                e(mq.broker_name),
                e(mq.queue_id),
                e(w.broker_offset),
                e(w.consumer_offset),
                e(max(0, w.broker_offset - w.consumer_offset)),
                e(when(w.last_timestamp)),
            ]
            for mq, w in stats.offset_table.items()
        ]
        body = f"<p>Lag {stats.diff_total} messages. {link(f'/dlq?group={q(group)}', 'Dead letters')}</p>"
        body += table(["topic", "broker", "queue", "max offset", "committed", "lag", "last consumed"], rows)
        body += (
            f'<h2>Lag, last hour</h2><div class="chart" id="lag-chart" data-series="lag" data-group="{e(group)}"></div>'
        )
        session = request.get("session")
        if session is not None and session.admin:
            topics = sorted({mq.topic for mq in stats.offset_table if not mq.topic.startswith("%")})
            options = "".join(f'<option value="{e(t)}">{e(t)}</option>' for t in topics)
            body += (
                f'<h2>Reset offset</h2><form method="post" action="/groups/{e(q(group))}/reset" '
                f'data-confirm="Reset the offsets of {e(group)}? Live consumers restart from there.">'
                f'{csrf_field(session)}<select name="topic">{options}</select> '
                '<select name="to"><option>earliest</option><option>latest</option></select> '
                f"{confirm_box('I know live consumers restart from there')} <button>Reset</button></form>"
            )
        return self.page(request, f"Group {group}", body, flash=flash, ok=ok)

    async def reset_offset(self, request: web.Request) -> web.Response:
        group = request.match_info["group"]
        form = await request.post()
        topic, to = str(form.get("topic", "")), str(form.get("to", ""))
        request["audit"] = f" reset-offset group={group} topic={topic} to={to}"
        if form.get("confirm") != "yes":
            return await self.group(request, flash="Not reset: tick the confirmation first.", ok=False)
        try:
            rows = await self.admin.reset_offset(group, topic, to)
        except TxmqError as exc:
            request["audit"] += f" failed: {exc}"
            return await self.group(request, flash=f"Reset failed: {exc}", ok=False)
        request["audit"] += f" queues={len(rows)}"
        return await self.group(request, flash=f"{topic} reset to {to} on {len(rows)} queue(s).")

    # -- transactions ---------------------------------------------------------------------------------------------

    async def transactions(self, request: web.Request) -> web.Response:
        group = request.query.get("group", "").strip()
        topic = request.query.get("topic", "").strip()
        older = request.query.get("older_than_s", "").strip()
        try:
            older_ms = int(float(older) * 1000) if older else None
        except ValueError:
            return self.failed(request, "Transactions", ValueError(f"older than: {older!r} is not a number"), 400)
        try:
            rows = await self.admin.list_transactions(group or None, topic or None, older_ms, limit=500)
        except TxmqError as exc:
            return self.failed(request, "Transactions", exc)
        filters = (
            '<form method="get" action="/transactions" class="filters">'
            f'<label>producer group <input name="group" value="{e(group)}"></label> '
            f'<label>topic <input name="topic" value="{e(topic)}"></label> '
            f'<label>older than (s) <input name="older_than_s" value="{e(older)}" size="6"></label> '
            "<button>Filter</button></form>"
        )
        cells = []
        for r in rows:
            ident = r.get("transactionId") or r.get("uniqKey") or r.get("halfMsgId")
            cells.append(
                [
                    link(f"/transactions/{q(str(ident))}", ident),
                    e(r.get("state")),
                    e(r.get("producerGroup")),
                    e(r.get("topic")),
                    e(age(r.get("ageMs"))),
                    e(r.get("checks")),
                    e("yes" if r.get("waitingForProducer") else ""),
                    e(r.get("brokerName")),
                ]
            )
        body = filters + f"<p>{len(rows)} transaction(s) in doubt or discarded.</p>"
        body += table(
            ["transaction", "state", "producer group", "topic", "age", "checks", "waiting for a producer", "broker"],
            cells,
            cls="transactions",
        )
        return self.page(request, "In-doubt transactions", body)

    async def transaction(self, request: web.Request, *, flash: str = "", ok: bool = True) -> web.Response:
        ident = request.match_info["ident"]
        try:
            tx = await self.admin.transaction(ident)
        except TxmqError as exc:
            status = 404 if isinstance(exc, MQBrokerError) and exc.code == ResponseCode.QUERY_NOT_FOUND else 502
            return self.failed(request, f"Transaction {ident}", exc, status)
        body = transaction_html(tx)
        session = request.get("session")
        if session is not None and session.admin and tx.get("state") in ("PREPARED", "DISCARDED"):
            body += (
                f'<h2>Resolve by hand</h2><form method="post" action="/transactions/{e(q(ident))}/resolve" '
                f'id="resolve" data-confirm="Resolve transaction {e(ident)}? This cannot be undone.">'
                f"{csrf_field(session)}"
                '<label><input type="radio" name="decision" value="COMMIT" required> commit (deliver it)</label> '
                '<label><input type="radio" name="decision" value="ROLLBACK"> roll back (never deliver)</label> '
                f"{confirm_box('I checked the producer database; this cannot be undone')} "
                '<button id="resolve-button">Resolve</button></form>'
            )
        return self.page(request, f"Transaction {ident}", body, flash=flash, ok=ok)

    async def resolve(self, request: web.Request) -> web.Response:
        ident = request.match_info["ident"]
        form = await request.post()
        decision = str(form.get("decision", "")).upper()
        request["audit"] = f" resolve transaction={ident} decision={decision}"
        if form.get("confirm") != "yes" or decision not in ("COMMIT", "ROLLBACK"):
            request["audit"] += " not confirmed"
            return await self.transaction(request, flash="Not resolved: choose a decision and confirm.", ok=False)
        try:
            tx = await self.admin.resolve_transaction(ident, decision)
        except TxmqError as exc:
            request["audit"] += f" refused: {exc}"
            return await self.transaction(request, flash=f"Refused: {exc}", ok=False)
        request["audit"] += f" state={tx.get('state')}"
        return await self.transaction(request, flash=f"Transaction {ident}: {tx.get('state')}.")

    # -- dead letters ---------------------------------------------------------------------------------------------

    async def dlq(
        self, request: web.Request, *, group: str | None = None, flash: str = "", ok: bool = True
    ) -> web.Response:
        group = group if group is not None else request.query.get("group", "").strip()
        try:
            groups = await self.console.groups()
        except TxmqError as exc:
            return self.failed(request, "Dead letters", exc)
        options = "".join(f'<option value="{e(g)}"{" selected" if g == group else ""}>{e(g)}</option>' for g in groups)
        body = (
            '<form method="get" action="/dlq" class="filters"><label>consumer group '
            f'<select name="group">{options}</select></label> <button>Show</button></form>'
        )
        if not group:
            return self.page(request, "Dead letters", body + "<p>Choose a group.</p>", flash=flash, ok=ok)
        try:
            letters = await self.admin.dead_letters(group)
        except TxmqError as exc:
            return self.failed(request, f"Dead letters of {group}", exc)
        session = request.get("session")
        rows = []
        for d in letters:
            action = ""
            if d.get("resent"):
                action = "resent"
            elif session is not None and session.admin:
                action = (
                    '<form method="post" action="/dlq/resend" class="inline resend" '
                    f'data-confirm="Put {e(d.get("msgId"))} back on %RETRY%{e(group)}?">{csrf_field(session)}'
                    f'<input type="hidden" name="group" value="{e(group)}">'
                    f'<input type="hidden" name="id" value="{e(d.get("offsetMsgId"))}">'
                    '<input type="hidden" name="confirm" value="yes"><button>Resend</button></form>'
                )
            rows.append(
                [
                    link(f"/message?q={q(str(d.get('offsetMsgId')))}", d.get("msgId")),
                    e(d.get("originTopic")),
                    e(d.get("reconsumeTimes")),
                    e(when(d.get("storeTimestamp"))),
                    e(d.get("reason")),
                    e(d.get("lastFailure")),
                    action,
                ]
            )
        body += (
            f"<p>{len(letters)} message(s) in %DLQ%{e(group)}. A resend puts one back on %RETRY%{e(group)}: only "
            "this group consumes it again.</p>"
        )
        body += table(["msgId", "origin topic", "reconsumed", "stored", "why", "last failure", ""], rows, cls="dlq")
        return self.page(request, f"Dead letters of {group}", body, flash=flash, ok=ok)

    async def resend(self, request: web.Request) -> web.Response:
        form = await request.post()
        group, ident = str(form.get("group", "")), str(form.get("id", ""))
        request["audit"] = f" dlq-resend group={group} id={ident}"
        if form.get("confirm") != "yes" or not group or not ident:
            return await self.dlq(request, group=group, flash="Not resent: confirm first.", ok=False)
        try:
            report = await self.admin.resend_dead_letters(group, [ident])
        except TxmqError as exc:
            request["audit"] += f" failed: {exc}"
            return await self.dlq(request, group=group, flash=f"Resend failed: {exc}", ok=False)
        audit_note = " ".join(f"{k}={','.join(v)}" for k, v in report.items() if v)
        request["audit"] += f" {audit_note}"
        if report["resent"]:
            return await self.dlq(request, group=group, flash=f"{ident} put back on %RETRY%{group}.")
        return await self.dlq(request, group=group, flash=f"Not resent: {audit_note}", ok=False)

    # -- message lookup -------------------------------------------------------------------------------------------

    async def message(self, request: web.Request) -> web.Response:
        ident = request.query.get("q", "").strip()
        topic = request.query.get("topic", "").strip()
        form = (
            '<form method="get" action="/message" class="filters">'
            f'<label>msgId, transaction id or key <input name="q" id="q" value="{e(ident)}" size="40"></label> '
            f'<label>topic (for a key or UNIQ_KEY) <input name="topic" id="topic" value="{e(topic)}"></label> '
            '<button id="lookup">Look up</button></form>'
        )
        if not ident:
            return self.page(request, "Message lookup", form)
        found: list[Any] = []
        problems: list[str] = []
        if looks_like_offset_msg_id(ident) or not topic:
            try:
                found = [await self.admin.view_message(ident)]
            except (TxmqError, ValueError) as exc:
                problems.append(str(exc))
        if not found and topic:
            try:
                found = await self.admin.query_message_by_uniq_key(topic, ident)
                if not found:
                    found = await self.admin.query_message_by_key(topic, ident)
            except TxmqError as exc:
                problems.append(str(exc))
        tx: dict[str, Any] | None = None
        tx_problem = ""
        candidates = [ident] + [m.properties.get(Prop.UNIQ_KEY, "") for m in found]
        for candidate in [c for c in candidates if c]:
            try:
                tx = await self.admin.transaction(candidate)
                break
            except MQBrokerError as exc:
                if exc.code != ResponseCode.QUERY_NOT_FOUND:
                    tx_problem = str(exc)
            except TxmqError as exc:
                tx_problem = str(exc)
        body = form
        if tx is not None:
            tid = tx.get("transactionId") or tx.get("uniqKey")
            body += (
                f'<p class="txstate">Transaction state: <b id="tx-state">{e(tx.get("state"))}</b> '
                f"({link(f'/transactions/{q(str(tid))}', 'whole history')})</p>"
            )
        elif found:
            body += '<p class="txstate">Transaction state: <b id="tx-state">none</b> (not a transactional message)</p>'
        if tx_problem:
            body += f'<p class="flash bad">{e(tx_problem)}</p>'
        if not found and tx is None:
            return self.page(request, "Message lookup", body, flash="; ".join(problems) or "Nothing found.", ok=False)
        for m in found:
            props = {k: v for k, v in sorted(m.properties.items()) if k not in HIDDEN_PROPERTIES}
            rows = [
                ["topic", e(m.topic)],
                ["queue", f"{e(m.broker_name)} #{e(m.queue_id)} offset {e(m.queue_offset)}"],
                ["msgId (UNIQ_KEY)", e(m.properties.get(Prop.UNIQ_KEY, ""))],
                ["offsetMsgId", e(m.offset_msg_id)],
                ["stored", e(when(m.store_timestamp))],
                ["born", f"{e(when(m.born_timestamp))} from {e(':'.join(map(str, m.born_host)))}"],
                ["reconsume times", e(m.reconsume_times)],
                ["properties", "<br>".join(f"{e(k)} = {e(v)}" for k, v in props.items())],
                ["body", f"<pre>{e(m.body[:2048].decode('utf-8', 'replace'))}</pre>"],
            ]
            body += table(["", ""], rows, cls="message")
        return self.page(request, "Message lookup", body)

    # -- chart data -----------------------------------------------------------------------------------------------

    async def history(self, request: web.Request) -> web.Response:
        history = self.console.history
        series = request.query.get("series", "throughput")
        if series == "lag":
            points = list(history.lag.get(request.query.get("group", ""), ()))
            data: Any = [[t for t, _ in points], [v for _, v in points]]
            labels = ["lag (messages)"]
        else:
            points3 = list(history.throughput)
            data = [[t for t, _, _ in points3], [p for _, p, _ in points3], [g for _, _, g in points3]]
            labels = ["put msg/s", "got msg/s"]
        return web.json_response({"labels": labels, "data": data})


def transaction_html(tx: dict[str, Any]) -> str:
    skip = {"checkLog", "messages", "resumedAt"}
    rows = []
    for key, value in tx.items():
        if key in skip or isinstance(value, dict | list):
            continue
        shown = when(value) if key.endswith("At") or key in ("bornTimestamp", "preparedAt") else value
        rows.append([e(key), e(shown if shown != "" else value)])
    body = f'<p>State: <b id="tx-state">{e(tx.get("state"))}</b></p>' + table(["", ""], rows, cls="tx")
    checks = tx.get("checkLog") or []
    body += "<h2>Checks and answers</h2>" + table(
        ["at", "what"],
        [[e(when(c.get("at") or c.get("atMs"))), e(", ".join(f"{k}={v}" for k, v in c.items()))] for c in checks],
    )
    members = tx.get("messages") or []
    if members:
        body += "<h2>Messages of this transaction</h2>" + table(
            ["message", "state", "topic"],
            [[e(m.get("uniqKey") or m.get("halfMsgId")), e(m.get("state")), e(m.get("topic"))] for m in members],
        )
    return body

"""txmq's web console (issue 17): cluster, topics, consumer lag with a chart, in-doubt transactions, dead letters and
message lookup, served by aiohttp.

It is a client of the cluster like ``txmq admin``: every page is made from :class:`txmq.client.Admin` calls, so the
same console runs inside a broker (``consolePort``) or on its own against a name server (``txmq console``). With
ACL on, people log in with an accessKey/secretKey of ``plain_acl.yml`` (checked by :mod:`txmq.acl`): an account with
SUB rights reads, an admin account also changes (resolve, resend, reset offset). Changes are POSTs carrying the
session's CSRF token; secrets are never rendered; every action is logged on ``txmq.console.audit`` with who did it.
"""

from __future__ import annotations

from txmq.console.app import Console, ConsoleSettings

__all__ = ["Console", "ConsoleSettings"]

"""Access control in RocketMQ's plain ACL model: ``plain_acl.yml`` accounts, signed requests, whitelists.

Modules: :mod:`~txmq.acl.config` (file model, loader, validation), :mod:`~txmq.acl.signer` (HMAC-SHA1 request
signatures, also used by txmq's client), :mod:`~txmq.acl.whitelist`, :mod:`~txmq.acl.permission`,
:mod:`~txmq.acl.decision` (the access decision), :mod:`~txmq.acl.manager` (files, reload, admin edits) and
:mod:`~txmq.acl.service` (the broker hook and the ACL admin requests). This package never imports the broker.
"""

from txmq.acl.signer import calculate_signature, sign_request, signing_content, verify_signature

__all__ = ["calculate_signature", "sign_request", "signing_content", "verify_signature"]

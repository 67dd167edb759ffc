"""Op markers of transactional messages (``RMQ_SYS_TRANS_OP_HALF_TOPIC``): what they say, and their text form.

One op record may hold several decisions. Its body is the half messages' queue offsets, comma-separated, as RocketMQ 5
writes a batched op message (RocketMQ 4 writes one offset). txmq's markers carry, per decision and in the same order,
comma-separated properties: ``TXMQ_HALF_PHYS`` (the half message's commit-log offset), ``TXMQ_DECISION`` (COMMIT,
ROLLBACK or DISCARD), ``TXMQ_BY`` (who decided) and ``TXMQ_COPY_MSG_ID`` (offsetMsgId of the delivered copy, or of the
TRANS_CHECK_MAX_TIME_TOPIC copy; an empty item when there is none); ``KEYS`` lists UNIQ_KEYs of half messages
(space-separated, so the key index finds the marker by each): the broker leaves out those of COMMITs stored together
with their copies, whose marker is found from the copy. A marker without txmq's properties (written by RocketMQ)
decides UNKNOWN for each of its offsets. No IO here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OP_TAG = "d"
RESUME_TAG = "txmq_resume"  # an operator resumed a DISCARDED transaction (never tag "d": RocketMQ would drop it)
PROP_DECISION = "TXMQ_DECISION"
PROP_HALF_PHYS = "TXMQ_HALF_PHYS"
PROP_BY = "TXMQ_BY"
PROP_COPY_MSG_ID = "TXMQ_COPY_MSG_ID"
UNKNOWN = "UNKNOWN"
SEPARATOR = ","


@dataclass(frozen=True, slots=True)
class MarkedDecision:
    """One decision an op marker holds."""

    half_queue_offset: int
    half_phys: int | None  # None in a marker written by RocketMQ
    decision: str  # COMMIT, ROLLBACK, DISCARD, or UNKNOWN (RocketMQ's markers)
    by: str | None
    copy_msg_id: str | None


def _items(props: dict[str, str], name: str, count: int) -> list[str] | None:
    raw = props.get(name)
    if raw is None:
        return None
    items = raw.split(SEPARATOR)
    return items if len(items) == count else None


def parse_marker(body: bytes, props: dict[str, str]) -> list[MarkedDecision]:
    """The decisions of an op record, in order. Raises ValueError for a body that is not decimal offsets.

    A txmq property whose item count differs from the body's is ignored (as if RocketMQ had written the marker).
    """
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"op marker body is not ASCII: {body[:40]!r}") from None
    offsets = [int(item) for item in text.split(SEPARATOR) if item.strip()]  # int() raises ValueError
    if not offsets:
        raise ValueError(f"op marker body holds no queue offset: {body[:40]!r}")
    n = len(offsets)
    phys = _items(props, PROP_HALF_PHYS, n)
    decisions = _items(props, PROP_DECISION, n)
    by = _items(props, PROP_BY, n)
    copies = _items(props, PROP_COPY_MSG_ID, n)
    out = []
    for i, offset in enumerate(offsets):
        half_phys = phys[i] if phys is not None else ""
        out.append(
            MarkedDecision(
                offset,
                int(half_phys) if half_phys.isdigit() else None,
                decisions[i] if decisions is not None and decisions[i] else UNKNOWN,
                by[i] if by is not None and by[i] else None,
                copies[i] if copies is not None and copies[i] else None,
            )
        )
    return out


def marker_fields(
    decisions: Sequence[tuple[int, int, str, str, str | None, str | None]],
) -> tuple[bytes, dict[str, str]]:
    """Body and txmq properties of a marker for ``(half queue offset, half phys, decision, by, copy msg id or None,
    uniq key or None)`` items (the tag and the UNIQ_KEY-less rest are the caller's)."""
    if not decisions:
        raise ValueError("an op marker holds at least one decision")
    offsets, phys, decided, by, copies, keys = zip(*decisions, strict=True)  # one pass per field, in C
    body = SEPARATOR.join(map(str, offsets)).encode("ascii")
    props = {
        PROP_HALF_PHYS: SEPARATOR.join(map(str, phys)),
        PROP_DECISION: SEPARATOR.join(decided),
        PROP_BY: SEPARATOR.join(by),
    }
    if any(copies):
        props[PROP_COPY_MSG_ID] = SEPARATOR.join([c or "" for c in copies])
    if any(keys):
        props["KEYS"] = " ".join([k for k in keys if k])
    return body, props

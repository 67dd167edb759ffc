"""The transaction counters since the broker started (``tx.*`` in GET_BROKER_RUNTIME_INFO), and a window of recent
times from prepare to decision."""

from __future__ import annotations

import collections

from txmq.txn.model import By, Decision

_COUNTER_OF_DECISION: dict[str, str] = {
    Decision.COMMIT: "commits",
    Decision.ROLLBACK: "rollbacks",
    Decision.DISCARD: "discards",
}


class TxCounters:
    """Counters since the broker started, and a window of recent times to resolution."""

    NAMES = (
        "halfMessages",
        "commits",
        "rollbacks",
        "checksSent",
        "checkAnswers",
        "discards",
        "resumes",
        "operatorResolutions",
        "refusedDecisions",
    )

    def __init__(self, window: int) -> None:
        self.values = dict.fromkeys(self.NAMES, 0)
        self.resolution_ms: collections.deque[int] = collections.deque(maxlen=max(1, window))

    def add(self, name: str, n: int = 1) -> None:
        self.values[name] += n

    def resolved(self, decision: str, by: str, waited_ms: int) -> None:
        """Count a decision (COMMIT, ROLLBACK or DISCARD); ``waited_ms``: from the prepare to the decision."""
        values = self.values
        values[_COUNTER_OF_DECISION[decision]] += 1
        if by == By.OPERATOR:
            values["operatorResolutions"] += 1
        if decision != Decision.DISCARD:
            self.resolution_ms.append(max(0, waited_ms))

    def snapshot(self, in_doubt: int, discarded: int) -> dict[str, int]:
        out = dict(self.values)
        out["inDoubt"] = in_doubt
        out["discardedNow"] = discarded
        samples = sorted(self.resolution_ms)
        out["resolutionSamples"] = len(samples)
        out["resolutionP50Ms"] = percentile(samples, 50)
        out["resolutionP99Ms"] = percentile(samples, 99)
        out["resolutionMaxMs"] = samples[-1] if samples else 0
        return out


def percentile(ordered: list[int], pct: int) -> int:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not ordered:
        return 0
    rank = max(1, -(-pct * len(ordered) // 100))
    return ordered[rank - 1]

"""What a campaign part found: named counts, the counts that must be zero, and how the part was run; a table for
people and a JSON document for machines."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class PartResult:
    """One part of the campaign (crash, fuzz, acl, disk). ``must_be_zero`` names counts whose non-zero value is a
    failure; ``info`` holds counts that are reported but allowed (redeliveries under at-least-once, say)."""

    name: str
    must_be_zero: dict[str, int] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)  # a few instances of each failure, for a person
    seconds: float = 0.0
    error: str | None = None  # the part could not run to its end (its counts then cover what ran)

    @property
    def ok(self) -> bool:
        return self.error is None and not any(self.must_be_zero.values())

    def fail(self, count: str, example: str, limit: int = 10) -> None:
        """Count one failure of kind ``count`` and keep its description among the first ``limit``."""
        self.must_be_zero[count] = self.must_be_zero.get(count, 0) + 1
        kept = self.examples.setdefault(count, [])
        if len(kept) < limit:
            kept.append(example)

    def zero(self, *counts: str) -> None:
        for count in counts:
            self.must_be_zero.setdefault(count, 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "must_be_zero": self.must_be_zero,
            "info": self.info,
            "examples": self.examples,
            "seconds": round(self.seconds, 1),
            "error": self.error,
        }


@dataclass
class CampaignReport:
    mode: str
    seed: int
    parts: list[PartResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "seed": self.seed,
            "ok": self.ok,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "parts": {p.name: p.to_json() for p in self.parts},
        }

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, sort_keys=False, default=str) + "\n")

    def table(self) -> str:
        rows: list[tuple[str, str, str, str]] = []
        for part in self.parts:
            verdict = "ok" if part.ok else ("ERROR" if part.error else "FAIL")
            rows.append((part.name, "", "", f"{verdict} ({part.seconds:.0f} s)"))
            for key, value in part.info.items():
                if not isinstance(value, (dict, list)):
                    rows.append(("", key, str(value), ""))
            for key, value in part.must_be_zero.items():
                rows.append(("", key, str(value), "must be 0" + ("" if value == 0 else "  <-- FAIL")))
            if part.error:
                rows.append(("", "error", part.error[:100], ""))
        widths = [max(len(r[i]) for r in [("part", "count", "value", "verdict"), *rows]) for i in range(4)]
        line = "  ".join(f"{{:<{w}}}" for w in widths)
        out = [line.format("part", "count", "value", "verdict"), line.format(*("-" * w for w in widths))]
        out += [line.format(*r).rstrip() for r in rows]
        out.append(f"campaign {'PASSED' if self.ok else 'FAILED'} (mode {self.mode}, seed {self.seed})")
        return "\n".join(out)

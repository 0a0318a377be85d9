"""What a probe found: `Outcome`, written by the worker as one JSON line and read back by the doctor."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vgpu.units import MIB

MiB = MIB


def mib(n: float) -> str:
    """Bytes as MiB for messages: `1024 MiB`."""
    return f"{n / MiB:.0f} MiB"


@dataclass(slots=True)
class Outcome:
    """A probe's verdict. `ok` is False only when it found a limit broken (or could not check what it must);
    a skipped probe (it cannot run here) is ok and says why in `reason`."""

    ok: bool
    skipped: bool = False
    reason: str = ""
    summary: str = ""
    figures: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def passed(cls, summary: str, **figures: Any) -> Outcome:
        """The limit held."""
        return cls(True, summary=summary, figures=figures)

    @classmethod
    def failed(cls, reason: str, **figures: Any) -> Outcome:
        """The limit was broken, or the probe could not check it."""
        return cls(False, reason=reason, figures=figures)

    @classmethod
    def skip(cls, reason: str, **figures: Any) -> Outcome:
        """The probe cannot run here (a missing entry point, framework, feature)."""
        return cls(True, skipped=True, reason=reason, figures=figures)

    def to_json(self) -> dict[str, Any]:
        """The JSON form (the worker's last line, the report's probe entry)."""
        return {"ok": self.ok, "skipped": self.skipped, "reason": self.reason, "summary": self.summary,
                "figures": self.figures}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Outcome:
        """Inverse of to_json."""
        return cls(bool(data["ok"]), bool(data.get("skipped", False)), str(data.get("reason", "")),
                   str(data.get("summary", "")), dict(data.get("figures") or {}))

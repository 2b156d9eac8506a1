"""One ``lint`` finding: a record of its own, so that checks kept in other modules (the tokenizer's,
:mod:`.tokenizer.checks`) build findings without importing the lint driver."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str            # error | warning | info
    file: str | None
    tensor: str | None
    message: str
    fix: str

    def to_dict(self) -> dict:
        return {"check": self.check, "severity": self.severity, "file": self.file, "tensor": self.tensor,
                "message": self.message, "fix": self.fix}

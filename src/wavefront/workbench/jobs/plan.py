"""``wavefront plan``: rank every parallel plan of a model on a cluster; ``--validate``: the model against
published runs. Torch-free.

    from wavefront.workbench.jobs import plan
    plan.plan(plan.PlanRequest(model="llama3-70b", gpus=("64xh100",))).as_dict()     # wavefront.plan/1
    plan.validate(plan.ValidateRequest(("runs.json",))).as_dict()                    # wavefront.plan.validation/1
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from wavefront.workbench.document import encode
from wavefront.workbench.planner import SCHEMA, CustomDims, PlanRequest, SearchResult
from wavefront.workbench.planner import plan as search
from wavefront.workbench.planner.validation import VALIDATION_SCHEMA, TableReport, validate_files

__all__ = ["SCHEMA", "VALIDATION_SCHEMA", "CustomDims", "PlanRequest", "SearchResult", "ValidateRequest",
           "ValidationReport", "plan", "validate"]


def plan(request: PlanRequest) -> SearchResult:
    """The search (planner.plan); ValueError carries a one-line message for a bad request."""
    return search(request)


@dataclass(frozen=True)
class ValidateRequest:
    paths: tuple[str | Path, ...]  # published-run tables (JSON)


@dataclass
class ValidationReport:
    SCHEMA: ClassVar[str] = VALIDATION_SCHEMA

    tables: list[TableReport]

    def as_dict(self) -> dict:
        """The ``wavefront plan --validate ... --json`` document (docs/json/plan.md)."""
        return {"schema": VALIDATION_SCHEMA, "tables": encode(self.tables)}


def validate(request: ValidateRequest) -> ValidationReport:
    """Each table's rows predicted by the model against what was published; ValueError for a bad table."""
    return ValidationReport(validate_files(list(request.paths)))

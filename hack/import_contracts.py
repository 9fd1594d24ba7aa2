"""import-linter contract types of our own, named in pyproject.toml's ``contract_types``.

``lint-imports`` (run from the repository root, which it puts on ``sys.path``) imports this module
as ``hack.import_contracts``. import-linter's own contracts can only forbid; this one allows:

``only_through``: the ``source_modules`` (and everything in them) may import modules of
``target_package`` only when they are one of ``allowed_modules`` (or inside one). So "backends
import cdiplug only through cdiplug.sdk" holds for every cdiplug module there is or will be, with
no list of forbidden ones to keep up to date. Only direct imports count: the SDK itself imports
the rest of cdiplug, which is the point of it.
"""

from __future__ import annotations

from typing import Any

from grimp import ImportGraph
from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


class OnlyThroughContract(Contract):
    """Direct imports from ``source_modules`` into ``target_package`` go only to ``allowed_modules``."""

    type_name = "only_through"

    source_modules = fields.ListField(subfield=fields.StringField())
    target_package = fields.StringField()
    allowed_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        sources: list[str] = self.source_modules  # type: ignore[assignment]
        target: str = self.target_package  # type: ignore[assignment]
        allowed: list[str] = self.allowed_modules  # type: ignore[assignment]
        for name in [*sources, target, *allowed]:
            if name not in graph.modules:
                raise ValueError(f"Module '{name}' does not exist.")
        importers = sorted({m for s in sources for m in (s, *graph.find_descendants(s))})
        broken: list[dict[str, Any]] = []
        for importer in importers:
            for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                if not _within(imported, target) or any(_within(imported, a) for a in allowed):
                    continue
                lines = sorted(d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported))
                broken.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not broken, warnings=[], metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(self.allowed_modules)  # type: ignore[arg-type]
        for b in check.metadata["broken"]:
            lines = ", ".join(f"l.{n}" for n in b["lines"])
            output.print_error(f"{b['importer']} imports {b['imported']} ({lines}); it may import only {allowed}", bold=False)
        output.new_line()

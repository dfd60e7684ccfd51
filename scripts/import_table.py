"""Count imports between the Edge's packages (docs/architecture.md "Packages and allowed imports").

    .venv/bin/python scripts/import_table.py [ROOT]

One row per (importer, imported) package pair with the number of import statements, product
code only (no tests, scripts or migrations); a pair imported both ways is marked as a cycle.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

TOPS = ("iop_site", "edgekit", "catalog", "pool", "refresh", "nodes")
SUBPACKAGES = {
    "pool": ("engine", "gate", "http", "metering"),
    "nodes": ("agent",),
    "catalog": ("config",),
}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in TOPS:
        return None
    if len(parts) > 1 and parts[1] in SUBPACKAGES.get(parts[0], ()):
        return ".".join(parts[:2])
    return parts[0]


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                found.append(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.append(node.module)
    return found


def count(root: Path) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for top in TOPS:
        for path in sorted((root / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            source = package_of(module)
            for target in imported_modules(ast.parse(path.read_text()), module, is_package):
                imported = package_of(target)
                if source and imported and imported != source:
                    counts[(source, imported)] += 1
    return counts


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    counts = count(root)
    cycles = {pair for pair in counts if (pair[1], pair[0]) in counts}
    print(f"{'importer':<16}{'imported':<16}{'count':>6}")
    for (source, imported), n in sorted(counts.items()):
        mark = "  <-> cycle" if (source, imported) in cycles else ""
        print(f"{source:<16}{imported:<16}{n:>6}{mark}")
    print(f"pairs: {len(counts)}  imports: {sum(counts.values())}  cycles: {len(cycles) // 2}")


if __name__ == "__main__":
    main()

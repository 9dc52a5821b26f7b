"""The lab rules that the grader enforces before it runs a submission.

Students write their code in a notebook that the grader executes, so a submission could try to earn points
without earning them: patch the assertion helpers, replace the hidden checks, import the course's reference
implementation, or kill the grading kernel. The labs state the rules (plain torch and a few stdlib modules,
no interpreter internals); this module checks every cell a student can edit against them, statically, and
the pipeline replaces each offending cell by one that raises an error naming the rule it broke. The rest of
the notebook is graded as usual, so a violation costs exactly the exercises that depend on that cell.

Cells that nbgrader restores from its database (locked cells and test cells) are not checked: the student's
version of them is never run. A static check cannot catch every trick; the grading kernel adds a second
layer (resource limits, checks imported before student code, see kernel_startup.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from IPython.core.inputtransformer2 import TransformerManager

ALLOWED_MODULES = frozenset({"torch", "math", "random", "itertools", "functools", "collections", "dataclasses",
                             "typing", "heapq"})
FORBIDDEN_NAMES = frozenset({
    "__builtins__", "__import__", "__loader__", "__spec__", "exec", "eval", "compile", "open", "globals", "locals",
    "vars", "setattr", "delattr", "getattr", "get_ipython", "exit", "quit", "breakpoint", "input", "help",
})
FORBIDDEN_ATTRIBUTES = frozenset({"os", "sys", "modules", "builtins", "gc", "subprocess", "importlib", "system",
                                  "popen", "kill", "_exit", "abort", "ctypes"})
ALLOWED_DUNDERS = frozenset({"__init__"})


@dataclass
class Violation:
    """One broken rule: where (`cell_index`, `grade_id` if the cell has one) and what (`reason`)."""

    cell_index: int
    grade_id: str | None
    reason: str


def module_root(name: str) -> str:
    return name.split(".")[0]


def attribute_root(node: ast.expr) -> ast.expr:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def top_level_names(source: str) -> set[str]:
    """Names that a (locked) cell binds at module level: students may not rebind them."""
    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def check_source(source: str, protected: set[str], module_names: set[str]) -> list[str]:
    """Reasons why `source` (one cell) breaks the lab rules; empty when it is fine.

    protected: names the locked cells define (helpers, given models) that students may not rebind;
    module_names: names bound to imported modules anywhere in the notebook (their attributes are read-only).
    """
    try:
        tree = ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return []  # it fails on its own when run, without any effect on the grader
    nested = {id(inner) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.Lambda, ast.ClassDef))
              for inner in ast.walk(node) if inner is not node}
    reasons = []
    for node in ast.walk(tree):
        reasons.extend(node_reasons(node))
        # A function's locals may shadow the lab's names; only module-level code can clobber them.
        reasons.extend(assignment_reasons(node, set() if id(node) in nested else protected, module_names))
    return sorted(set(reasons))


def node_reasons(node: ast.AST) -> list[str]:
    """Imports outside the allowed modules, forbidden built-ins, interpreter attributes, special attributes."""
    if isinstance(node, ast.Import):
        modules = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        modules = [node.module or "."] if node.level == 0 else ["(relative import)"]
    else:
        modules = []
    reasons = [f"imports {module!r} (allowed: {', '.join(sorted(ALLOWED_MODULES))})"
               for module in modules if module_root(module) not in ALLOWED_MODULES]
    if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
        reasons.append(f"uses {node.id!r}")
    if isinstance(node, ast.Attribute):
        if node.attr in FORBIDDEN_ATTRIBUTES:
            reasons.append(f"reaches for the attribute {node.attr!r}")
        if node.attr.startswith("__") and node.attr.endswith("__") and node.attr not in ALLOWED_DUNDERS:
            reasons.append(f"uses the special attribute {node.attr!r}")
    return reasons


def assignment_reasons(node: ast.AST, protected: set[str], module_names: set[str]) -> list[str]:
    """Rebinding a protected name, writing into an imported module or a provided object, or setting attributes
    on anything but `self` (the door to patching library functions through an alias)."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [f"redefines {node.name!r}, which the lab provides"] if node.name in protected else []
    else:
        return []
    reasons = []
    for target in targets:
        for part in ast.walk(target):
            if isinstance(part, ast.Name) and part.id in protected and part is target:
                reasons.append(f"rebinds {part.id!r}, which the lab provides")
            if isinstance(part, ast.Name) and part.id == "self" and part is target:
                reasons.append("rebinds 'self'")
            if isinstance(part, ast.Attribute) and part is target:
                root = attribute_root(part)
                if not (isinstance(root, ast.Name) and root.id == "self"):
                    reasons.append("sets an attribute of something other than 'self'")
            if isinstance(part, (ast.Attribute, ast.Subscript)):
                root = attribute_root(part)
                if isinstance(root, ast.Name) and (root.id in module_names or root.id in protected):
                    reasons.append(f"modifies {root.id!r}, which belongs to the lab or a library")
    return reasons


def is_restored_by_nbgrader(cell) -> bool:
    """Locked cells and test cells: nbgrader overwrites them with the released version before running."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("locked")) or (bool(meta.get("grade")) and not meta.get("solution"))


def find_violations(nb, release) -> list[Violation]:
    """Every rule broken by a cell of submission `nb` that the student could edit; `release` is the
    student version of the lab (its locked cells define the protected names)."""
    released = {c.metadata["nbgrader"]["grade_id"]: c for c in release.cells
                if c.cell_type == "code" and is_restored_by_nbgrader(c)}
    protected = set().union(*(top_level_names(c.source) for c in released.values()
                              if not c.metadata["nbgrader"].get("grade")))
    module_names = {module_root(n) for n in protected if module_root(n) in ALLOWED_MODULES} | {"torch"}
    seen: set[str] = set()
    violations = []
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in released and grade_id not in seen:
            seen.add(grade_id)  # nbgrader replaces the first cell with this id by the released one
            continue
        for reason in check_source(cell.get("source", ""), protected, module_names):
            violations.append(Violation(index, grade_id, reason))
    return violations


def neutralise(nb, violations: list[Violation]) -> None:
    """Replace each offending cell of `nb` (in place) by one that raises an error listing its violations."""
    by_cell: dict[int, list[str]] = {}
    for violation in violations:
        by_cell.setdefault(violation.cell_index, []).append(violation.reason)
    for index, reasons in by_cell.items():
        message = "The grader did not run this cell because it breaks the lab rules: " + "; ".join(reasons)
        nb.cells[index].source = f"raise RuntimeError({message!r})"

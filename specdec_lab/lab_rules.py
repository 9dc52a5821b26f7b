"""The lab rules as early warnings for honest students (not a security mechanism).

Graded labs run in a sandbox and are judged outside it (autograder/), so nothing a cell does can change a
grade. These rules only warn about code that will not work when the lab is graded, or that makes the tests see
something other than the student's own work: importing `specdec_lab` (not available to graded notebooks: the
lab asks you to write it), replacing a function or model the lab provides, patching a library, or stopping the
interpreter. A warning never stops a cell and never costs points. The labs' setup cells call `watch()` so each
warning shows under the cell that caused it; the grader lists the same warnings in the feedback.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

LIBRARIES = frozenset({"torch", "math", "random", "itertools", "functools", "collections", "transformers"})
STOPPERS = {("sys", "exit"), ("os", "_exit"), ("os", "kill"), ("os", "abort"), ("os", "system")}


@dataclass
class Warning_:
    """One warning: the line it refers to (1-based, 0 for the whole cell) and the advice."""

    line: int
    message: str


def module_aliases(tree: ast.AST) -> dict[str, str]:
    """Names bound to library modules in `tree` (alias -> module): imports, and plain copies like `t = torch`."""
    aliases = {m: m for m in LIBRARIES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    aliases[target.id] = aliases[node.value.id]
    return aliases


def assigned_roots(target: ast.expr) -> list[ast.expr]:
    """The containers an assignment target writes into: `a.b[c] = ...` writes into `a` (never into `c`)."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [root for element in target.elts for root in assigned_roots(element)]
    if isinstance(target, ast.Starred):
        return assigned_roots(target.value)
    if isinstance(target, ast.Attribute):
        node = target
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        return [target] if isinstance(node, ast.Name) else []
    return []


def dotted(node: ast.expr) -> list[str]:
    """`torch.nn.functional.x` -> ["torch", "nn", "functional", "x"] (empty when it is not a plain chain)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []


def check_cell(source: str, provided: set[str]) -> list[Warning_]:
    """Warnings for one cell's `source`; `provided` are the names the lab's locked cells define (functions,
    classes, models) that tests rely on. Code that does not parse gets no warning (it fails on its own)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    aliases = module_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(name.split(".")[0] == "specdec_lab" for name in names):
                found.append(Warning_(node.lineno, "imports specdec_lab, which graded notebooks do not have "
                                                   "(the lab asks you to write this part yourself)"))
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for root in assigned_roots(target):
                chain = dotted(root)
                if chain and chain[0] in aliases and aliases[chain[0]] in LIBRARIES:
                    found.append(Warning_(node.lineno, f"patches the library: `{'.'.join(chain)} = ...` changes "
                                                       "what every test sees, not only your code"))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in provided and node.col_offset == 0:
            found.append(Warning_(node.lineno, f"redefines `{node.name}`, which the lab provides; the tests use "
                                               "the lab's version, so your answer may not be what gets checked"))
        if isinstance(node, ast.Call) and tuple(dotted(node.func)[-2:]) in STOPPERS:
            found.append(Warning_(node.lineno, f"calls {'.'.join(dotted(node.func))}(), which stops your "
                                               "notebook when it is graded: the cells after it earn nothing"))
    return sorted({(w.line, w.message): w for w in found}.values(), key=lambda w: w.line)


def provided_names(locked_sources: list[str]) -> set[str]:
    """Functions and classes defined at the top level of the lab's locked cells."""
    names = set()
    for source in locked_sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        names.update(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))
    return names


def watch(shell=None, provided: set[str] | None = None) -> None:
    """Print the warnings of every cell after it runs in this IPython `shell` (the labs' setup cells call it).
    `provided`: the names the lab defines; by default the functions and classes defined so far."""
    shell = shell or get_ipython()  # noqa: F821 - only called inside IPython
    names = set(provided) if provided is not None else {
        name for name, value in shell.user_ns.items() if callable(value) and not name.startswith("_")}

    armed = []  # the first call reports the cell that called watch() (the lab's own setup): skip it

    def after(result) -> None:
        if not armed:
            armed.append(True)
            return
        source = getattr(result.info, "raw_cell", "") or ""
        for warning in check_cell(shell.transform_cell(source), names):
            print(f"lab rules, line {warning.line}: {warning.message}")

    previous = _watching.pop(id(shell), None)
    if previous is not None:  # the setup cell ran again: one hook, not two
        shell.events.unregister("post_run_cell", previous)
    _watching[id(shell)] = after
    shell.events.register("post_run_cell", after)


_watching: dict[int, object] = {}

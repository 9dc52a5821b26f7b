"""The benchmark's prompt sets, drawn from the corpus's validation files (never seen in training).

"heldout": a function's signature and docstring; the model writes the body. "grounded": a function is shown, then
its header again, so the continuation repeats the prompt (where prompt lookup shines). `corpus_prompts` draws
either set deterministically; the lessons, the sweep and the engines' comparisons use the same prompts.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass

PROMPT_SETS = ("heldout", "grounded")


@dataclass
class Prompt:
    """One benchmark prompt: where it came from, its text, and its token ids."""

    source: str
    text: str
    ids: list[int]


def documented_functions(source: str) -> list[tuple[ast.FunctionDef, list[str]]]:
    """The functions of a module's source that have a docstring, with the source's lines."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(node) is not None:
            found.append((node, lines))
    return sorted(found, key=lambda item: item[0].lineno)


def signature_and_docstring(node: ast.FunctionDef, lines: list[str]) -> str:
    """The function's header and docstring, dedented: what a held-out prompt shows.

    Prompts end on their last character, never on a newline: the tokenizer merges a newline with the next
    line's indentation, so a prompt ending in a bare newline would look like a dedent to the model.
    """
    docstring_end = node.body[0].end_lineno
    return textwrap.dedent("\n".join(lines[node.lineno - 1 : docstring_end]))


def shown_then_repeated(node: ast.FunctionDef, lines: list[str]) -> str:
    """The whole function, then a comment and its header again: the continuation repeats the prompt (ending,
    like every prompt, without a newline)."""
    whole = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    header = whole.splitlines()[: node.body[0].lineno - node.lineno]
    return f"{whole}\n\n\n# {node.name}, copied unchanged:\n" + "\n".join(header)


def corpus_prompts(kind: str, tokenizer, count: int, max_tokens: int) -> list[Prompt]:
    """`count` prompts of one kind ("heldout" or "grounded") from the corpus's validation files.

    Files are visited round-robin so the prompts come from as many files as possible; prompts longer than
    `max_tokens` tokens, or grounded candidates that are too short or too long, are passed over. The order
    is deterministic (the corpus split is a hash of the file path).
    """
    from specdec_lab.train.corpus import load_corpus

    corpus = load_corpus()
    per_file = []
    for path in corpus.val_files:
        functions = documented_functions(corpus.read(path))
        if kind == "grounded":
            functions = [(n, lines) for n, lines in functions if 4 <= n.end_lineno - n.lineno <= 30]
            texts = [shown_then_repeated(n, lines) for n, lines in functions]
        else:
            texts = [signature_and_docstring(n, lines) for n, lines in functions]
        per_file.append([(f"{path}:{n.lineno}", text) for (n, _), text in zip(functions, texts, strict=True)])
    prompts: list[Prompt] = []
    for depth in range(max((len(f) for f in per_file), default=0)):
        for candidates in per_file:
            if depth < len(candidates) and len(prompts) < count:
                source, text = candidates[depth]
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if 8 <= len(ids) <= max_tokens:
                    prompts.append(Prompt(source, text, ids))
    if len(prompts) < count:
        raise ValueError(f"only {len(prompts)} {kind} prompts of at most {max_tokens} tokens in the validation "
                         f"files; ask for fewer (--prompts {len(prompts)}) or fewer new tokens")
    return prompts

"""The training corpus: the running interpreter's standard-library Python source.

It exists on every machine, so nothing is copied into the repository. Files are read in a fixed order and
split into train/validation by a hash of their path, so the split never depends on the directory walk.
"""

from __future__ import annotations

import ast
import hashlib
import os
import platform
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

# Folders of vendored packages or build artefacts: never read.
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__", "__phello__"}
# Test suites: read only when a recipe asks for them, and then only as extra training text.
TEST_DIRS = {"test", "tests", "idle_test"}


def stdlib_root() -> Path:
    """The folder holding the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_validation(relative_path: str, val_percent: int) -> bool:
    """Whether a file belongs to the validation split (stable hash of its path, `val_percent` in 100)."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < val_percent


@dataclass
class Corpus:
    """Standard-library source files, split by file into train and validation."""

    root: Path
    train_files: list[str] = field(default_factory=list)
    val_files: list[str] = field(default_factory=list)
    # Test-suite files that add training text. The ones whose path hash falls in the validation share are
    # left out altogether, so validation figures and held-out prompts stay library code, comparable across zoos.
    test_files: list[str] = field(default_factory=list)

    def read(self, relative_path: str) -> str:
        """The text of one corpus file (undecodable bytes replaced, so every file is usable)."""
        return (self.root / relative_path).read_text(encoding="utf-8", errors="replace")

    def texts(self, split: str) -> list[str]:
        """All texts of one split ("train" or "val"), in the corpus order (test files last in "train")."""
        files = {"train": self.train_files + self.test_files, "val": self.val_files}[split]
        return [self.read(f) for f in files]

    def fingerprint(self) -> str:
        """A short hash of the exact files (names and bytes), recorded with every model trained on them."""
        h = hashlib.sha256()
        for split, files in (("train", self.train_files), ("val", self.val_files), ("test", self.test_files)):
            for rel in files:
                h.update(f"{split}:{rel}".encode())
                h.update(hashlib.sha256((self.root / rel).read_bytes()).digest())
        return h.hexdigest()[:16]

    def describe(self) -> dict:
        """What a model card records about the data it was trained on."""
        return {
            "source": "Python standard library (.py files outside test folders)"
            + (", plus its test folders as training text" if self.test_files else ""),
            "python_version": platform.python_version(),
            "train_files": len(self.train_files),
            "val_files": len(self.val_files),
            "test_files": len(self.test_files),
            "fingerprint": self.fingerprint(),
        }


def load_corpus(root: Path | None = None, val_percent: int = 5, test_folders: bool = False) -> Corpus:
    """Collect the `.py` files under `root` (default: this interpreter's stdlib), split by path hash.

    root: folder to read; val_percent: share of files (in percent) that go to validation; test_folders:
    also read the test suites, as training text only (about 1.6x the library's size in Python 3.11).
    """
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"corpus folder not found: {root}")
    corpus = Corpus(root=root)
    skipped = EXCLUDED_DIRS if test_folders else EXCLUDED_DIRS | TEST_DIRS
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skipped and not d.startswith("config-"))
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
            held_out = is_validation(rel, val_percent)
            if TEST_DIRS.intersection(rel.split("/")[:-1]):
                if not held_out:
                    corpus.test_files.append(rel)
            else:
                (corpus.val_files if held_out else corpus.train_files).append(rel)
    for files in (corpus.train_files, corpus.val_files, corpus.test_files):
        files.sort()
    return corpus


def heldout_prompts(count: int = 100, corpus: Corpus | None = None) -> list[str]:
    """Prompts from the validation files: a function's signature and docstring, ready to be completed.

    count: how many (in corpus order, at most one per function); corpus: where to read (default: stdlib).
    Models never saw these files in training, so completions measure generalisation, not recall.
    """
    return function_prompts("val", count, corpus)


def function_prompts(split: str, count: int, corpus: Corpus | None = None) -> list[str]:
    """A function's signature and docstring from each documented function of one split, in corpus order.

    split: "train" or "val"; count: the most to return; corpus: where to read (default: stdlib).
    Each prompt ends right after the docstring's closing quotes (no trailing newline).
    """
    corpus = corpus or load_corpus()
    files = {"train": corpus.train_files, "val": corpus.val_files}[split]
    prompts: list[str] = []
    for rel in files:
        source = corpus.read(rel)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.body:
                continue
            first = node.body[0]
            has_docstring = isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                and isinstance(first.value.value, str)
            if not has_docstring or len(node.body) < 2:
                continue
            start = node.lineno - 1 - len(node.decorator_list)
            text = "".join(lines[start : first.end_lineno])
            indent = len(text) - len(text.lstrip())
            # End at the closing quotes, not after the newline: the tokenizer merges a newline with the next
            # line's indentation, so a prompt ending in a bare newline would look like a dedent to the model.
            prompts.append((textwrap.dedent(text) if indent else text).rstrip("\n"))
            if len(prompts) == count:
                return prompts
    return prompts

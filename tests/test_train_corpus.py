"""The training corpus: the split by path hash, and the test suites as optional, training-only text."""

from __future__ import annotations

from specdec_lab.train.corpus import is_validation, load_corpus


def write_tree(root, files: list[str]) -> None:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\nx = 1\n")


def test_test_suites_add_training_text_only_and_leave_the_library_split_alone(tmp_path):
    library = [f"pkg{i}/mod{j}.py" for i in range(6) for j in range(6)]
    tests = [f"test/test_{i}.py" for i in range(40)] + [f"pkg0/tests/test_{i}.py" for i in range(10)]
    write_tree(tmp_path, library + tests + ["site-packages/vendored.py", "pkg1/notes.txt"])
    val_percent = 30  # big enough that some test files hash into the validation share

    plain = load_corpus(tmp_path, val_percent)
    both = load_corpus(tmp_path, val_percent, test_folders=True)

    assert plain.test_files == [] and sorted(plain.train_files + plain.val_files) == sorted(library)
    # The library split does not move, so validation figures and held-out prompts stay comparable.
    assert (both.train_files, both.val_files) == (plain.train_files, plain.val_files)
    held_out = [rel for rel in tests if is_validation(rel, val_percent)]
    assert held_out and both.test_files == sorted(set(tests) - set(held_out))  # held-out test files: not read
    assert len(both.texts("train")) == len(plain.train_files) + len(both.test_files)
    assert both.texts("val") == plain.texts("val")
    assert both.fingerprint() != plain.fingerprint()
    assert both.describe()["test_files"] == len(both.test_files) and "test folders" in both.describe()["source"]


def long_lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if len(line.strip()) > 40}


def test_the_real_test_suites_do_not_carry_the_validation_files_into_training():
    # A test suite may quote the module it tests (doctests, copied fixtures). If it copied a validation file,
    # training on the suites would leak held-out text and flatter validation loss and held-out prompts.
    corpus = load_corpus(test_folders=True)
    library = set().union(*(long_lines(corpus.read(rel)) for rel in corpus.train_files))
    suites = set().union(*(long_lines(corpus.read(rel)) for rel in corpus.test_files))
    held_out = [long_lines(corpus.read(rel)) for rel in corpus.val_files]
    lines = sum(len(lines) for lines in held_out)
    only_in_suites = sum(len((lines & suites) - library) for lines in held_out)
    assert lines > 1000 and only_in_suites / lines < 0.01  # 9 of 5149 lines (0.17%) with Python 3.11.7

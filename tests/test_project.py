"""The set-up files agree: conda environment vs pyproject pins, README's two commands, CI and Makefile."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def environment() -> dict:
    return yaml.safe_load((ROOT / "environment.yml").read_text())


def conda_dependencies() -> list[str]:
    return [entry for entry in environment()["dependencies"] if isinstance(entry, str)]


def pip_requirements() -> list[str]:
    sections = [entry["pip"] for entry in environment()["dependencies"] if isinstance(entry, dict) and "pip" in entry]
    assert len(sections) == 1, "environment.yml should have exactly one pip section"
    return sections[0]


def requirement_name(requirement: str) -> str:
    return re.split(r"[=<>!~\[ ;]", requirement, maxsplit=1)[0].strip().lower()


def pinned(requirements: list[str], name: str) -> str:
    matches = [r.replace(" ", "") for r in requirements if requirement_name(r) == name]
    assert len(matches) == 1, f"expected one {name} requirement, found {matches}"
    return matches[0]


def test_both_files_use_python_3_11():
    assert "python=3.11" in [entry.replace(" ", "") for entry in conda_dependencies()]
    project = pyproject()
    assert project["project"]["requires-python"].replace(" ", "") == ">=3.11"
    assert project["tool"]["ruff"]["target-version"] == "py311"


def test_torch_and_transformers_pins_are_the_same_in_both_files():
    dependencies = pyproject()["project"]["dependencies"]
    for name in ("torch", "transformers"):
        assert pinned(pip_requirements(), name) == pinned(dependencies, name)
    assert pinned(dependencies, "torch") == "torch==2.13.*"
    assert pinned(dependencies, "transformers").startswith("transformers>=5.")


def test_environment_installs_this_package_with_its_lab_extras():
    installs = [r.replace(" ", "") for r in pip_requirements() if re.match(r"^(-e)?\s*\.", r.replace(" ", ""))
                or r.startswith("-e")]
    assert installs, "environment.yml's pip section does not install the package"
    extras = re.search(r"\[([^\]]*)\]", installs[0])
    assert extras and "lab" in extras.group(1).split(","), installs[0]
    assert "lab" in pyproject()["project"]["optional-dependencies"]


def test_the_console_script_points_at_the_cli():
    assert pyproject()["project"]["scripts"]["specdec"] == "specdec_lab.cli:main"


def test_the_readme_opens_with_make_lab_and_make_test():
    readme = ROOT / "README.md"
    assert readme.is_file(), "README.md is missing"
    blocks = re.findall(r"```[^\n]*\n(.*?)```", readme.read_text(), flags=re.DOTALL)
    assert blocks, "README.md has no code block"
    commands = [line.split("#", 1)[0].strip() for line in blocks[0].splitlines()]  # comments may explain them
    assert [command for command in commands if command] == ["make lab", "make test"]


def test_the_makefile_has_the_entry_points_and_ci_runs_make_test():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("lab", "test", "demo"):
        assert re.search(rf"^{target}:", makefile, flags=re.MULTILINE), f"Makefile has no `{target}` target"
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^\s*make test\b", ci, flags=re.MULTILINE)


def test_the_course_folders_exist():
    for folder in ("lessons", "labs", "solutions", "autograder", "specdec_lab", "tests"):
        assert (ROOT / folder).is_dir(), folder

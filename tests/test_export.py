"""`specdec export`: a completed lab notebook becomes an artifact folder; unfinished or broken input is refused.

The lab solution notebooks (solutions/) are the completed work; blank releases are the same notebooks with
every solution region replaced as nbgrader does it (plus the releases already generated into labs/). Small
notebooks of our own cover the failure cases. Benchmarks run on tiny random models with the zoo tokenizer.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest
import torch
from transformers import AutoTokenizer

from specdec_lab import vllm
from specdec_lab.cli import main
from specdec_lab.export import ExportError, export, extract, ready
from specdec_lab.models import zoo_path

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "lab01_sampling" / "lab01_sampling.ipynb"
LOOP_SOLUTION = ROOT / "solutions" / "lab02_loop" / "lab02_loop.ipynb"
TRAINING_SOLUTION = ROOT / "solutions" / "lab06_train_drafter" / "lab06_train_drafter.ipynb"
LOOKAHEAD_SOLUTION = ROOT / "solutions" / "lab05_lookahead" / "lab05_lookahead.ipynb"
TREE_SOLUTION = ROOT / "solutions" / "lab03_trees" / "lab03_trees.ipynb"
EAGLE_SOLUTION = ROOT / "solutions" / "lab04_eagle" / "lab04_eagle.ipynb"
needs_vllm = pytest.mark.skipif(vllm.missing() is not None, reason=str(vllm.missing()))
SOLUTION_REGION = re.compile(r"### BEGIN SOLUTION\n.*?### END SOLUTION", re.S)

CORRECT_VERIFY = '''
def verify(draft_tokens, p, q, generator):
    """Accepted prefix plus one target token."""
    ### BEGIN SOLUTION
    k = len(draft_tokens)
    u = torch.rand(k, generator=generator)
    for i, token in enumerate(draft_tokens.tolist()):
        if not u[i] * q[i, token] < p[i, token]:
            extra = (p[i] - q[i]).clamp(min=0)
            extra = extra / extra.sum() if extra.sum() > 0 else p[i]
            return draft_tokens[:i].tolist() + [int(torch.multinomial(extra, 1, generator=generator))]
    return draft_tokens.tolist() + [int(torch.multinomial(p[k], 1, generator=generator))]
    ### END SOLUTION
'''


def lab_notebook(path: Path, solution: str) -> Path:
    """A small graded notebook with the lab structure: title, locked setup cell, solution cell, test cell."""
    def nbgrader(**meta):
        return {"nbgrader": {"schema_version": 3, "grade": False, "solution": False, "locked": False, **meta}}

    cells = [
        nbformat.v4.new_markdown_cell("# Lab 0: a tiny verification lab"),
        nbformat.v4.new_code_cell("%matplotlib inline\nimport torch\ntorch.set_num_threads(1)",
                                  metadata=nbgrader(grade_id="setup", locked=True)),
        nbformat.v4.new_code_cell("TOLERANCE = 1e-6\n" + solution + "\nprint(verify)",
                                  metadata=nbgrader(grade_id="verify", solution=True)),
        nbformat.v4.new_code_cell("assert verify is not None",
                                  metadata=nbgrader(grade_id="test_verify", grade=True, locked=True, points=1)),
        nbformat.v4.new_code_cell("scratch = 1 / 0  # the student's own experiments are not exported"),
    ]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), str(path))
    return path


def blank_release(solution: Path, path: Path) -> Path:
    """The student version of a solution notebook, as `nbgrader generate_assignment` writes it."""
    notebook = nbformat.read(str(solution), as_version=4)
    for cell in notebook.cells:  # solution regions sit in function bodies, indented by four spaces
        cell.source = SOLUTION_REGION.sub("# YOUR CODE HERE\n    raise NotImplementedError()", cell.source)
    nbformat.write(notebook, str(path))
    return path


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory, llama_factory):
    tokenizer = AutoTokenizer.from_pretrained(str(zoo_path() / "tokenizer"))
    folder = tmp_path_factory.mktemp("export_models")
    for name, seed, width in (("target", 0, 48), ("draft", 1, 32)):
        model = llama_factory(vocab_size=len(tokenizer), hidden_size=width, num_layers=1, seed=seed,
                              max_positions=1024, eos_token_id=tokenizer.eos_token_id, logit_scale=4.0)
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
    return {"target": str(folder / "target"), "draft": str(folder / "draft")}


def run_export(notebook: Path, out: Path, model_paths: dict, **kw) -> Path:
    return export(notebook, out, prompts=2, max_new_tokens=8, repeats=1, threads=1, log=lambda line: None,
                  **model_paths, **kw)


def import_artifact(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"artifact_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def test_exported_solution_imports_and_runs(model_paths, tmp_path):
    out = run_export(SOLUTION, tmp_path / "artifact", model_paths)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "benchmark.json", "lab01_sampling.py",
                                                     "report.html"]
    module = import_artifact(out, "lab01_sampling")
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    assert module.verify(torch.tensor([1]), p, q, torch.Generator().manual_seed(0)) == [1, 2]
    assert torch.allclose(module.residual(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])),
                          torch.tensor([0.0, 1.0]))
    result = json.loads((out / "benchmark.json").read_text())
    greedy = result["sets"]["temperature 0"]["methods"]
    assert greedy["yours"]["outputs_equal_to_baseline"] == greedy["reference"]["outputs_equal_to_baseline"] == 2
    assert set(result["sets"]["temperature 1"]["methods"]) == {"plain", "reference", "yours"}
    text = (out / "README.md").read_text()
    for name in ("process_logits", "residual", "accepted_count", "verify", "first_token_histogram"):
        assert f"`{name}`" in text
    assert "on 2 of\n  2 prompts" in text or "2 of 2 prompts" in text.replace("\n  ", " ")
    source = (out / "lab01_sampling.py").read_text()
    assert "BEGIN SOLUTION" not in source and "figure.show()" not in source and "_checks" not in source
    assert leftovers(tmp_path) == []


def test_exported_loop_lab_imports_and_runs(model_paths, tmp_path):
    """Lab 2: the student's whole loop runs on the benchmark pair and matches greedy decoding."""
    out = run_export(LOOP_SOLUTION, tmp_path / "artifact", model_paths)
    module = import_artifact(out, "lab02_loop")
    tokens, forwards = module.generate(module.PROMPT, 10, k=3)  # on the lab's own tiny models
    assert len(tokens) == 10 and 1 <= forwards <= 10
    greedy = json.loads((out / "benchmark.json").read_text())["sets"]["temperature 0"]["methods"]
    assert greedy["yours"]["outputs_equal_to_baseline"] == 2
    assert greedy["yours"]["tau"] == pytest.approx(greedy["reference"]["tau"], abs=0.01)
    assert "my loop" in (out / "README.md").read_text()


def test_exported_training_lab_trains_heads_that_the_engine_accepts(tmp_path):
    """Lab 6: the student's training code trains EAGLE heads on the lab's own target; in `specdec_lab.generate`
    (through the thin chain adapter) they reproduce plain greedy decoding and beat an untrained head."""
    out = export(TRAINING_SOLUTION, tmp_path / "artifact", prompts=2, max_new_tokens=12, threads=1,
                 log=lambda line: None)
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "benchmark.json", "lab06_train_drafter.py", "vllm"]
    assert sorted(p.name for p in (out / "vllm" / "eagle").iterdir()) == ["config.json", "model.safetensors"]
    assert "specdec export --vllm" in json.loads((out / "benchmark.json").read_text())["vllm"]["not_run"]
    methods = json.loads((out / "benchmark.json").read_text())["methods"]
    assert all(m["outputs_equal_to_baseline"] == 2 for m in methods.values()), methods
    assert methods["my trained EAGLE head"]["tau"] > methods["untrained head"]["tau"] + 0.5, methods
    assert "my trained EAGLE head" in (out / "README.md").read_text()
    module = import_artifact(out, "lab06_train_drafter")
    inputs, tokens, targets = module.eagle_pairs(torch.arange(6.0).reshape(1, 3, 2), torch.tensor([[1, 5, 6]]),
                                                 torch.tensor([[True, True, True]]))
    assert tokens.tolist() == [5, 6] and inputs.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    assert leftovers(tmp_path) == []


def test_a_lab_eagle_head_in_vllm_layout_computes_what_the_lab_head_computes(tmp_path):
    """Lab 6's head, converted for vLLM's `eagle` method, gives the same next features under vLLM's computation
    (written from llama_eagle.py: fc over [embedding ; feature], a decoder layer, here with zero attention) as
    the lab's own forward, at every position of a sequence; a fused EAGLE-3 head is refused with the reason."""
    from specdec_lab.export import lab_head_as_vllm_checkpoint

    module = import_artifact(export_module_only(tmp_path), "lab06_train_drafter")
    head = module.EagleHead(seed=3)
    with torch.no_grad():
        for w in head.parameters():  # random weights everywhere, the norm's included
            w.copy_(torch.randn(w.shape, generator=torch.Generator().manual_seed(w.numel())) * 0.3)
    config = module.target.config
    vllm_config, state = lab_head_as_vllm_checkpoint(head, config)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(7, config.hidden_size, generator=generator)
    tokens = torch.randint(2, config.vocab_size, (7,), generator=generator)
    with torch.no_grad():
        ours = head(features, tokens)
    theirs = vllm.eagle_features_as_vllm(state, vllm_config, features, module.EMBED[tokens], torch.arange(7))
    assert torch.allclose(theirs, ours, atol=1e-5), (theirs - ours).abs().max()
    with pytest.raises(ExportError, match="EAGLE-3"):
        lab_head_as_vllm_checkpoint(module.EagleHead(inputs=3), config)


def export_module_only(folder: Path) -> Path:
    """The lab 6 solution's extracted module, written into `folder` (no benchmark)."""
    (folder / "lab06_train_drafter.py").write_text(extract(TRAINING_SOLUTION).source, encoding="utf-8")
    return folder


@needs_vllm
def test_exported_training_lab_head_runs_in_vllm(tmp_path):
    """`specdec export --vllm`: vLLM loads the lab's target and the student's trained head from the artifact and
    decodes with them: greedy output equal to plain decoding, tau within 15% of ours on the same prompts."""
    out = tmp_path / "artifact"
    main(["export", str(TRAINING_SOLUTION), "--out", str(out), "--prompts", "3", "--max-new-tokens", "24",
          "--repeats", "1", "--threads", "2", "--vllm"])
    in_vllm = json.loads((out / "benchmark.json").read_text())["vllm"]
    assert in_vllm["outputs_equal_to_ours"] == 3, in_vllm
    assert in_vllm["ours_tau"] > 2.0 and abs(in_vllm["tau"] / in_vllm["ours_tau"] - 1) <= 0.15, in_vllm
    assert f"tau {in_vllm['tau']:.2f}" in (out / "README.md").read_text()


def test_exported_lookahead_lab_imports_and_runs(model_paths, tmp_path):
    """Lab 5: the student's prompt lookup drafts inside the engine; greedy output and tau match the engine's own."""
    out = run_export(LOOKAHEAD_SOLUTION, tmp_path / "artifact", model_paths)
    module = import_artifact(out, "lab05_lookahead")
    assert module.prompt_lookup([1, 2, 3, 1, 2], 2, 3) == [3, 1, 2]
    tokens, forwards = module.jacobi_decode(module.PROMPT, 4)  # on the lab's own tiny target
    assert tokens == module.greedy(module.PROMPT, 4) and 1 <= forwards <= 5
    greedy = json.loads((out / "benchmark.json").read_text())["sets"]["temperature 0"]["methods"]
    assert greedy["yours"]["outputs_equal_to_baseline"] == greedy["reference"]["outputs_equal_to_baseline"] == 2
    assert greedy["yours"]["tau"] == pytest.approx(greedy["reference"]["tau"], abs=1e-9)
    assert "my prompt lookup" in (out / "README.md").read_text()


def test_lookup_that_drafts_too_much_is_refused(model_paths, tmp_path):
    """A prompt_lookup that ignores k cannot drive the engine; the export says so and writes nothing."""
    notebook = nbformat.read(str(LOOKAHEAD_SOLUTION), as_version=4)
    for cell in notebook.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "prompt_lookup":
            cell.source = cell.source.replace("tokens[start + n : start + n + k]", "tokens[start + n :] + [0] * k")
    nbformat.write(notebook, str(tmp_path / "lab05_lookahead.ipynb"))
    with pytest.raises(ExportError, match="returned .* tokens when asked for at most"):
        run_export(tmp_path / "lab05_lookahead.ipynb", tmp_path / "artifact", model_paths)


def test_exported_tree_lab_imports_and_runs(model_paths, tmp_path):
    """Lab 3: the student's positions, masks and tree verification drive the engine's Medusa tree decoding."""
    out = run_export(TREE_SOLUTION, tmp_path / "artifact", model_paths)
    module = import_artifact(out, "lab03_trees")
    rows = module.tree_logits(module.model, module.CONTEXT, [1, 2, 3], [-1, -1, 0])  # on the lab's own tiny model
    assert rows.shape == (4, module.VOCAB)
    assert torch.allclose(rows[3], module.next_token_logits(module.model, module.CONTEXT + [1, 3]), atol=1e-5)
    result = json.loads((out / "benchmark.json").read_text())
    greedy = result["sets"]["temperature 0"]["methods"]
    assert greedy["yours"]["outputs_equal_to_baseline"] == greedy["reference"]["outputs_equal_to_baseline"] == 2
    assert greedy["yours"]["tau"] == pytest.approx(greedy["reference"]["tau"], abs=0.01)
    assert set(result["sets"]["temperature 1"]["methods"]) == {"plain", "reference", "yours"}
    assert "my tree code" in (out / "README.md").read_text()


def solution_with(solution: Path, path: Path, old: str, new: str) -> Path:
    """The solution notebook with `old` replaced by `new` in its source (a student's mistake)."""
    notebook = nbformat.read(str(solution), as_version=4)
    edited = [cell for cell in notebook.cells if old in cell.source]
    assert len(edited) == 1
    edited[0].source = edited[0].source.replace(old, new)
    nbformat.write(notebook, str(path))
    return path


def test_wrong_tree_mask_is_caught_by_the_benchmark(model_paths, tmp_path):
    """A 4D mask that hides the committed context: greedy tree decoding stops matching plain decoding."""
    notebook = solution_with(TREE_SOLUTION, tmp_path / "lab03_trees.ipynb", "torch.ones(n, past, dtype=torch.bool)",
                             "torch.zeros(n, past, dtype=torch.bool)")
    out = run_export(notebook, tmp_path / "artifact", model_paths)
    greedy = json.loads((out / "benchmark.json").read_text())["sets"]["temperature 0"]["methods"]
    assert greedy["reference"]["outputs_equal_to_baseline"] == 2
    assert greedy["yours"]["outputs_equal_to_baseline"] < 2


def test_tree_verification_off_the_tree_is_refused(model_paths, tmp_path):
    """A greedy verification that returns nodes which are not a root path cannot drive the engine."""
    notebook = solution_with(TREE_SOLUTION, tmp_path / "lab03_trees.ipynb", "            return path, wanted",
                             "            return path + [len(tokens) - 1], wanted")
    with pytest.raises(ExportError, match="must be a path down from the root"):
        run_export(notebook, tmp_path / "artifact", model_paths)
    assert not (tmp_path / "artifact").exists() and leftovers(tmp_path) == []


def released_notebooks(tmp_path: Path) -> list[Path]:
    """Every solution notebook made blank, plus the releases already generated into labs/."""
    blanks = [blank_release(path, tmp_path / path.name) for path in sorted((ROOT / "solutions").glob("lab*/*.ipynb"))]
    return blanks + sorted((ROOT / "labs").glob("lab*/*.ipynb"))


def test_blank_release_is_refused_and_nothing_is_written(model_paths, tmp_path):
    notebooks = released_notebooks(tmp_path)
    assert len(notebooks) >= 2
    for notebook in notebooks:
        out = tmp_path / "artifact"
        with pytest.raises(ExportError, match=r"is not finished: \d+ exercise\(s\) still raise NotImplementedError"):
            run_export(notebook, out, model_paths)
        assert not out.exists() and leftovers(tmp_path) == []


def test_cli_refuses_blank_release_with_a_clear_message(tmp_path, capsys):
    notebook = blank_release(SOLUTION, tmp_path / "lab01_sampling.ipynb")
    with pytest.raises(SystemExit, match="error: .*is not finished.*complete them, then export"):
        main(["export", str(notebook), "--out", str(tmp_path / "artifact")])
    assert not (tmp_path / "artifact").exists()


@pytest.mark.parametrize("content, message", [
    ("{ this is not json", "not a readable Jupyter notebook"),
    ('{"cells": 3, "metadata": {}}', "not a readable Jupyter notebook"),
    ("def verify(): pass\n", "not a readable Jupyter notebook"),
])
def test_corrupt_files_are_refused(tmp_path, content, message):
    notebook = tmp_path / "lab.ipynb"
    notebook.write_text(content)
    with pytest.raises(ExportError, match=message):
        extract(notebook)


def test_notebook_without_graded_cells_or_missing_is_refused(tmp_path):
    plain = tmp_path / "plain.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), str(plain))
    with pytest.raises(ExportError, match="no nbgrader solution cells"):
        extract(plain)
    with pytest.raises(ExportError, match="no such file"):
        extract(tmp_path / "missing.ipynb")


def test_own_notebook_keeps_definitions_and_drops_activity(tmp_path):
    extracted = extract(lab_notebook(tmp_path / "lab00_tiny.ipynb", CORRECT_VERIFY))
    assert extracted.lab == "lab00_tiny" and extracted.title == "Lab 0: a tiny verification lab"
    assert list(extracted.functions) == ["verify"]
    assert "import torch" in extracted.source and "def verify" in extracted.source
    assert "TOLERANCE = 1e-6" in extracted.source  # literal constants stay: functions may read them
    for activity in ("%matplotlib", "set_num_threads", "print(verify)", "1 / 0", "assert verify"):
        assert activity not in extracted.source


def test_wrong_rule_is_caught_by_the_benchmark(model_paths, tmp_path):
    """p and q swapped in the residual: greedy outputs stop matching, and the artifact says so."""
    swapped = CORRECT_VERIFY.replace("(p[i] - q[i])", "(q[i] - p[i])")
    out = run_export(lab_notebook(tmp_path / "lab00_tiny.ipynb", swapped), tmp_path / "artifact", model_paths)
    greedy = json.loads((out / "benchmark.json").read_text())["sets"]["temperature 0"]["methods"]
    assert greedy["reference"]["outputs_equal_to_baseline"] == 2
    assert greedy["yours"]["outputs_equal_to_baseline"] < 2


def test_malformed_verify_output_is_refused(model_paths, tmp_path):
    """A verify that forgets the target's own token cannot drive the engine; nothing is written."""
    no_bonus = CORRECT_VERIFY.replace(" + [int(torch.multinomial(p[k], 1, generator=generator))]", "")
    no_bonus = no_bonus.replace(" + [int(torch.multinomial(extra, 1, generator=generator))]", "")
    notebook = lab_notebook(tmp_path / "lab00_tiny.ipynb", no_bonus)
    with pytest.raises(ExportError, match="exactly one target token"):
        run_export(notebook, tmp_path / "artifact", model_paths)
    assert not (tmp_path / "artifact").exists() and leftovers(tmp_path) == []


def test_existing_folder_needs_force(model_paths, tmp_path):
    out = tmp_path / "artifact"
    out.mkdir()
    (out / "old.txt").write_text("keep me unless forced")
    notebook = lab_notebook(tmp_path / "lab00_tiny.ipynb", CORRECT_VERIFY)
    with pytest.raises(ExportError, match="already exists.*--force"):
        run_export(notebook, out, model_paths)
    assert (out / "old.txt").exists()
    run_export(notebook, out, model_paths, force=True)
    assert not (out / "old.txt").exists() and (out / "lab00_tiny.py").exists()
    assert leftovers(tmp_path) == []


def test_ready_makes_the_same_checks_as_export(tmp_path):
    """Lesson 8 says "ready to export" only when `specdec export` would get to its benchmark."""
    found, benchmark = ready(SOLUTION)
    assert "verify" in found.functions and set(benchmark.needs) <= set(found.functions)
    with pytest.raises(ExportError, match="NotImplementedError"):
        ready(blank_release(SOLUTION, tmp_path / "lab01_sampling.ipynb"))
    broken = nbformat.read(SOLUTION, as_version=4)
    for cell in broken.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "residual":
            cell.source += "\n\ndef smoothed(p, eps=EPSILON_DEFINED_NOWHERE):\n    return p + eps\n"
    nbformat.write(broken, tmp_path / "broken.ipynb")
    assert "smoothed" in extract(tmp_path / "broken.ipynb").functions  # extraction alone does not import
    with pytest.raises(ExportError, match="fails to import: NameError"):
        ready(tmp_path / "broken.ipynb")


def test_exported_eagle_lab_imports_and_runs(model_paths, tmp_path):
    """Lab 4: the student's dynamic_tree and head_forward draft in the engine with the same head as the engine's
    EAGLE-2 drafter (one built from the target: the zoo head does not fit these models); greedy outputs match
    plain decoding and the two draft the same trees, so their tau agree."""
    assert ready(EAGLE_SOLUTION)[1].needs == ("head_forward", "eagle_chain", "dynamic_tree")  # lesson 8's check
    out = run_export(EAGLE_SOLUTION, tmp_path / "artifact", model_paths)
    module = import_artifact(out, "lab04_eagle")
    tokens, parents = module.dynamic_tree(module.head, module.target_features(module.PROMPT[:2]), module.PROMPT[:3],
                                          depth=4, top_k=2, budget=8)  # on the lab's own tiny models
    assert len(tokens) == len(parents) == 8 and parents[0] == -1
    greedy = json.loads((out / "benchmark.json").read_text())["sets"]["temperature 0"]["methods"]
    assert greedy["yours"]["outputs_equal_to_baseline"] == greedy["reference"]["outputs_equal_to_baseline"] == 2
    assert greedy["yours"]["tau"] == pytest.approx(greedy["reference"]["tau"], abs=0.01)
    assert greedy["reference"]["tau"] > 1.0, "the head built from the target should get some drafts accepted"
    text = (out / "README.md").read_text()
    assert "my `dynamic_tree`" in text and "`head_forward`" in text


def test_blank_eagle_release_is_refused_with_the_unfinished_exercises(model_paths, tmp_path):
    notebook = blank_release(EAGLE_SOLUTION, tmp_path / "lab04_eagle.ipynb")
    with pytest.raises(ExportError, match=r"is not finished: 5 exercise\(s\) still raise NotImplementedError "
                                          r"\(eagle_training_pairs, head_forward, eagle_chain, select_nodes, "
                                          r"dynamic_tree\)"):
        run_export(notebook, tmp_path / "artifact", model_paths)
    assert not (tmp_path / "artifact").exists() and leftovers(tmp_path) == []

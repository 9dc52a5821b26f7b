"""llama.cpp on the zoo pair: the GGUF conversion, its tokeniser against ours, its greedy decoding against ours,
and its speculative examples' reports.

The tests that run llama.cpp need its build (`make production`, which `.ci/run` does); without it they skip and
say so. The pure parts (pre-tokenizer mapping, report parsing, agreement) always run.
"""

from __future__ import annotations

import json

import pytest

from specdec_lab import generate, llamacpp, load_pair
from specdec_lab.models import zoo_path

REPORT = """
0.00.265.021 I encoded   17 tokens in    0.004 seconds, speed: 4250.000 t/s
0.00.265.023 I decoded   64 tokens in    0.125 seconds, speed:  512.000 t/s
0.00.265.023 I
0.00.265.023 I n_draft   = 4
0.00.265.023 I n_predict = 64
0.00.265.024 I n_drafted = 60
0.00.265.024 I n_accept  = 41
0.00.265.025 I accept    = 68.333%
"""

needs_build = pytest.mark.skipif(llamacpp.missing() is not None, reason=str(llamacpp.missing()))


def test_our_tokenizer_maps_to_gpt2_pre_tokenization_and_others_are_refused(tmp_path):
    assert llamacpp.pre_tokenizer(zoo_path() / "tokenizer") == "gpt-2"
    spec = json.loads((zoo_path() / "tokenizer" / "tokenizer.json").read_text())
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "_"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="no llama.cpp pre-tokenizer is known to match"):
        llamacpp.pre_tokenizer(tmp_path)


def test_a_report_gives_tau_the_course_way():
    figures = llamacpp.parse_report(REPORT)
    run = llamacpp.ExampleRun("", int(figures["n_predict"]), int(figures["n_drafted"]),
                              int(figures["n_accept"]), figures["seconds"])
    assert figures["seconds"] == pytest.approx(0.129)
    assert run.tau == pytest.approx(64 / 23) and run.acceptance == pytest.approx(41 / 60)
    with pytest.raises(RuntimeError, match="no statistics"):
        llamacpp.parse_report("main: error: failed to load model")


def test_the_generated_text_is_what_follows_the_echoed_prompt():
    assert llamacpp.generated_text("\n\ndef f(x):\n    return x\n\n", "def f(x):") == "\n    return x"
    with pytest.raises(RuntimeError, match="did not echo the prompt"):
        llamacpp.generated_text("\n\ndef f(y):", "def f(x):")


def test_agreement_counts_equal_positions_and_finds_the_first_difference():
    assert llamacpp.agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (1.0, None)
    assert llamacpp.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == (0.75, 2)
    assert llamacpp.agreement([1, 2], [1, 2, 3, 4]) == (0.5, 2)


def test_without_a_build_the_rows_say_what_to_run(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_LLAMACPP_HOME", str(tmp_path))
    assert "make production" in llamacpp.missing()
    with pytest.raises(llamacpp.LlamaCppUnavailable, match="not built"):
        llamacpp.require()


def test_a_build_without_the_server_says_so_and_the_server_refuses_to_start(monkeypatch, tmp_path):
    # A build made before the server was part of it: the examples, the library and the log flusher, no server.
    monkeypatch.setenv("SPECDEC_LLAMACPP_HOME", str(tmp_path))
    llamacpp.bin_dir().mkdir(parents=True)
    for name in (*llamacpp.BINARIES, "libllama.so", llamacpp.FLUSH_LOG):
        (llamacpp.bin_dir() / name).touch()
    assert llamacpp.missing() is None
    assert "built without llama-server" in llamacpp.server_missing() and "make production" in llamacpp.server_missing()
    from specdec_lab.llamacpp_server import LlamaServer

    with pytest.raises(llamacpp.LlamaCppUnavailable, match="built without llama-server"):
        LlamaServer()


@pytest.fixture(scope="module")
def gguf():
    return llamacpp.convert_zoo()


@pytest.fixture(scope="module")
def zoo():
    return load_pair()


def heldout_texts(count: int, chars: int) -> list[str]:
    """Slices of the validation split's source files: code none of the models trained on."""
    from specdec_lab.train.corpus import load_corpus

    corpus = load_corpus()
    return [corpus.read(path)[:chars] for path in corpus.val_files[:count]]


@needs_build
def test_llamacpp_tokenises_held_out_code_exactly_as_we_do(gguf, zoo):
    model = llamacpp.load(gguf["target"])
    texts = heldout_texts(30, 3000)
    differing = [i for i, text in enumerate(texts)
                 if llamacpp.tokenize(model, text) != zoo.tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert sum(map(len, texts)) > 50_000
    assert differing == [], f"token ids differ on held-out files {differing}"


@needs_build
def test_llamacpp_greedy_decoding_agrees_with_ours(gguf, zoo):
    """Both engines compute in fp32, but with different kernels, so a near-tie between the two best tokens can
    flip; a flip changes everything after it. We ask that the first 8 tokens agree on at least 8 of 10 held-out
    prompts (a broken conversion, say a wrong rope or norm setting, agrees on almost none)."""
    from specdec_lab.bench import corpus_prompts

    model = llamacpp.load(gguf["target"])
    prompts = corpus_prompts("heldout", zoo.tokenizer, 10, 200)
    first_eight = 0
    for prompt in prompts:
        ours = generate(zoo.target, prompt.ids, max_new_tokens=8).tokens
        theirs = llamacpp.greedy(model, prompt.ids, 8)
        first_eight += ours == theirs
    assert first_eight >= 8, f"the first 8 greedy tokens agree on {first_eight} of 10 prompts"


@needs_build
def test_llamacpp_speculative_examples_report_accepted_drafts(gguf, zoo):
    from specdec_lab.bench import corpus_prompts

    prompt = corpus_prompts("grounded", zoo.tokenizer, 1, 200)[0]
    plain = zoo.tokenizer.decode(llamacpp.greedy(llamacpp.load(gguf["target"]), prompt.ids, 32))
    draft = llamacpp.run_example("llama-speculative-simple", prompt.text, 32, 4, gguf["target"], gguf["draft"])
    lookup = llamacpp.run_example("llama-lookup", prompt.text, 32, 8, gguf["target"])
    for run in (draft, lookup):
        assert run.new_tokens >= 32 and 0 < run.accepted <= run.drafted and run.tau > 1.0, run
    assert draft.text.startswith(plain[:40]), (draft.text, plain)


@needs_build
def test_the_bench_puts_llamacpp_rows_next_to_ours(zoo):
    from specdec_lab import bench

    config = bench.BenchConfig(methods=["plain", "llamacpp", "llamacpp-draft", "llamacpp-lookup"], prompts=2,
                               max_new_tokens=16, repeats=1, warmup=0, threads=1, prompt_sets=("grounded",),
                               progress=False)
    report = bench.run_benchmark(config, zoo)
    rows = report["sets"]["grounded"]["methods"]
    assert report["skipped"] == {}
    plain, draft = rows["llamacpp"], rows["llamacpp-draft"]
    assert plain["family"] == "llama.cpp" and plain["tau"] == 1.0 and plain["tokens_per_second"] > 0
    assert draft["tau"] > 1.0 and 0 < draft["acceptance_rate"] <= 1
    assert draft["measured_speedup_vs_own_ar"] is not None, "llama.cpp rows compare with llama.cpp's own plain row"

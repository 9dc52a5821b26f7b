"""llama.cpp next to our engine: build it from PyPI's source distribution, convert the zoo pair to GGUF with its
own converter, and run its plain, draft-model and prompt-lookup decoding on the same prompts.

Nothing here re-implements llama.cpp; it drives llama.cpp's own code. The sources are the `vendor/llama.cpp`
folder of the `llama-cpp-python` source distribution on PyPI (the only network this needs is the package
registry). `build()` compiles the CPU library, the two examples the course runs (`llama-speculative-simple`,
draft-model speculation, and `llama-lookup`, prompt lookup) and the server (`llama-server`, driven by
`specdec_lab.llamacpp_server`) into a cache outside the repository:
`$SPECDEC_LLAMACPP_HOME`, by default `~/.cache/specdec-lab/llama.cpp-<version>`. The Python bindings of the
same release (its `llama_cpp` package, pure Python over ctypes) load the library that build made, which gives
token-level access for tokenisation and plain greedy decoding.

    python -m specdec_lab.llamacpp build        # once (make production); prints the build time
    python -m specdec_lab.llamacpp convert      # the zoo target and draft as GGUF files
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specdec_lab.engines import EngineUnavailable, acceptance, agreement, cache_root, course_tau, engine_stats

__all__ = ["agreement"]  # shared with the vLLM runner (specdec_lab.engines); kept here for existing callers

VERSION = "0.3.36"  # the llama-cpp-python release whose vendor/llama.cpp we build (llama.cpp at that commit)
BINARIES = ("llama-speculative-simple", "llama-lookup")
SERVER = "llama-server"  # the OpenAI-compatible server (`specdec_lab.llamacpp_server`), built beside the examples
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=ON"]


# Preloaded into the examples: llama.cpp logs from a background thread that it never stops (on purpose, see its
# common_log_main), so an example can exit before the thread has written the last lines, which hold the statistics
# we read (seen often on a busy machine). At exit this stops the logger the way llama.cpp's own
# common_log_pause does, which first writes out everything queued.
FLUSH_LOG_SOURCE = """
struct common_log;
common_log * common_log_main();
void common_log_pause(common_log * log);

__attribute__((destructor)) static void specdec_flush_llama_log() {
    common_log_pause(common_log_main());
}
"""
FLUSH_LOG = "libspecdec_flush_log.so"


class LlamaCppUnavailable(EngineUnavailable):
    """llama.cpp is not built here (or cannot be); the message says why and what to run."""


def home() -> Path:
    """Where the sources and the build live (outside the repository, shared by every checkout)."""
    default = cache_root() / f"llama.cpp-{VERSION}"
    return Path(os.environ.get("SPECDEC_LLAMACPP_HOME", default))


def sources() -> Path:
    """The unpacked llama-cpp-python source distribution (its `vendor/llama.cpp` is llama.cpp itself)."""
    return home() / f"llama_cpp_python-{VERSION}"


def llama_cpp_dir() -> Path:
    return sources() / "vendor" / "llama.cpp"


def bin_dir() -> Path:
    return home() / "build" / "bin"


def missing() -> str | None:
    """None when llama.cpp is built and usable here, else the reason (with the command that fixes it)."""
    needed = [bin_dir() / name for name in (*BINARIES, "libllama.so", FLUSH_LOG)]
    absent = [p.name for p in needed if not p.exists()]
    if absent:
        return (f"llama.cpp is not built in {home()} (missing {', '.join(absent)}): run `make production` "
                "(needs cmake and a C++ compiler; it builds once, into a cache outside the repository)")
    return None


def server_missing() -> str | None:
    """None when llama.cpp's server is built here too, else the reason (a build made before the server was part
    of it has the examples only: `make production` adds the server to it)."""
    reason = missing()
    if reason is None and not (bin_dir() / SERVER).exists():
        reason = (f"llama.cpp in {home()} was built without {SERVER}: run `make production` (it adds the server to "
                  "the build, once)")
    return reason


def require() -> None:
    """Raise LlamaCppUnavailable with the reason when llama.cpp is not built."""
    reason = missing()
    if reason:
        raise LlamaCppUnavailable(reason)


# ------------------------------------------------------------------------------------------------ building


def download_sources(log=print) -> Path:
    """Fetch and unpack the source distribution from PyPI (once); returns `sources()`."""
    if (llama_cpp_dir() / "CMakeLists.txt").exists():
        return sources()
    home().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home()) as tmp:
        log(f"downloading llama-cpp-python=={VERSION} (source distribution) from PyPI")
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", tmp], check=True)
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as handle:
            handle.extractall(tmp, filter="data")
        # Unpacked in a temporary folder, moved into place at once: an interrupted run leaves nothing half-made.
        os.replace(Path(tmp) / sources().name, sources())
    return sources()


def build(jobs: int = 2, log=print) -> float:
    """Download the sources if needed and build the library and the examples; returns the build's seconds.

    jobs: parallel compile jobs. Raises LlamaCppUnavailable when cmake or a C++ compiler is missing.
    """
    tools = [t for t in ("cmake", "c++") if shutil.which(t) is None]
    if tools:
        raise LlamaCppUnavailable(f"building llama.cpp needs {' and '.join(tools)} (Debian: apt-get install "
                                  "cmake g++)")
    download_sources(log)
    started = time.perf_counter()
    build_dir, build_log = home() / "build", home() / "build.log"
    log(f"building llama.cpp into {build_dir} with {jobs} jobs (compiler output: {build_log})")
    with open(build_log, "w") as output:  # the compiler's warnings go to the log, not the terminal
        for step in (["cmake", "-S", str(llama_cpp_dir()), "-B", str(build_dir), *CMAKE_FLAGS],
                     ["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", "llama", *BINARIES, SERVER]):
            if subprocess.run(step, stdout=output, stderr=subprocess.STDOUT).returncode != 0:
                raise LlamaCppUnavailable(f"building llama.cpp failed: see {build_log}")
    build_flush_log()
    seconds = time.perf_counter() - started
    (home() / "build.json").write_text(json.dumps({"version": VERSION, "seconds": round(seconds, 1),
                                                   "jobs": jobs, "flags": CMAKE_FLAGS}, indent=1))
    return seconds


def build_flush_log() -> Path:
    """Compile the small library that makes the examples write their whole log before they exit."""
    source = home() / "flush_log.cpp"
    source.write_text(FLUSH_LOG_SOURCE)
    library = bin_dir() / FLUSH_LOG
    subprocess.run(["c++", "-O2", "-shared", "-fPIC", "-o", str(library), str(source), f"-L{bin_dir()}",
                    "-lllama-common", f"-Wl,-rpath,{bin_dir()}"], check=True)
    return library


# ---------------------------------------------------------------------------------------------- converting


def pre_tokenizer(tokenizer_dir: Path) -> str:
    """The llama.cpp pre-tokenizer that splits text as our tokenizer does.

    llama.cpp recognises a BPE tokenizer by the hash of its ids on a test string and knows only published
    models, so ours is unknown to it. What matters is how text is split before the merges: ours is byte-level
    with GPT-2's regular expression and no normaliser, which is exactly llama.cpp's "gpt-2" pre-tokenizer (the
    tests compare the two tokenisations on held-out code).
    """
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    pre, normalizer = spec.get("pre_tokenizer") or {}, spec.get("normalizer")
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and normalizer is None:
        return "gpt-2"
    raise ValueError(f"no llama.cpp pre-tokenizer is known to match {tokenizer_dir}: pre_tokenizer {pre}, "
                     f"normalizer {normalizer}")


# Runs in a child process: llama.cpp's converter with one pre-tokenizer registered for the model folder being
# converted (the installed files stay untouched), then its own command line.
CONVERT_SHIM = """
import sys
root, folder, name = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path[:0] = [root, root + "/gguf-py"]
from conversion.base import TextModel
known = TextModel.get_vocab_base_pre

def get_vocab_base_pre(self, tokenizer):
    if str(self.dir_model) == folder:
        return name
    return known(self, tokenizer)

TextModel.get_vocab_base_pre = get_vocab_base_pre
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[4:]]
convert_hf_to_gguf.main()
"""


def convert(model_dir: Path, tokenizer_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """Convert a Hugging Face Llama folder to a GGUF file with llama.cpp's own converter.

    model_dir: config.json and model.safetensors; tokenizer_dir: its tokenizer files (the zoo keeps them
    apart); out: the .gguf file to write (written next to it first, then moved into place); outtype: f32
    keeps the weights as trained (the zoo stores float16; f32 makes llama.cpp compute in the precision our
    engine uses on a CPU).
    """
    if not (llama_cpp_dir() / "convert_hf_to_gguf.py").exists():
        raise LlamaCppUnavailable(f"llama.cpp's converter is not in {llama_cpp_dir()}: run `make production`")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        folder = Path(tmp) / "model"
        folder.mkdir()
        for source in [*Path(model_dir).glob("*.json"), *Path(model_dir).glob("*.safetensors"),
                       *Path(tokenizer_dir).glob("*.json")]:
            (folder / source.name).symlink_to(source.resolve())
        partial = Path(tmp) / out.name
        done = subprocess.run([sys.executable, "-c", CONVERT_SHIM, str(llama_cpp_dir()), str(folder),
                               pre_tokenizer(Path(tokenizer_dir)), "--outtype", outtype, "--outfile",
                               str(partial), str(folder)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"llama.cpp's converter failed on {model_dir}:\n{done.stderr[-3000:]}")
        os.replace(partial, out)
    return out


def convert_zoo(out_dir: Path | None = None) -> dict[str, Path]:
    """The zoo target and draft as GGUF files in `out_dir` (default: the cache); reused when already there."""
    from specdec_lab.models import folder_digest, zoo_path

    zoo = zoo_path()
    out_dir = Path(out_dir) if out_dir else home() / "gguf"
    files = {}
    for role in ("target", "draft"):
        # Named by a digest of the weights and the tokenizer: a retrained zoo never reuses a stale conversion.
        files[role] = out_dir / f"{zoo.name}-{role}-{folder_digest(zoo / role, zoo / 'tokenizer')}.gguf"
        if not files[role].exists():
            convert(zoo / role, zoo / "tokenizer", files[role])
    return files


# ------------------------------------------------------------------------------------------------- running


def bindings():
    """llama-cpp-python's `llama_cpp` module, loading the library this cache built."""
    require()
    os.environ["LLAMA_CPP_LIB_PATH"] = str(bin_dir())
    if str(sources()) not in sys.path:
        sys.path.append(str(sources()))
    import llama_cpp

    return llama_cpp


def load(gguf: Path, threads: int = 1, context: int = 1024):
    """A llama.cpp model (`llama_cpp.Llama`) on the CPU, quiet."""
    return bindings().Llama(model_path=str(gguf), n_ctx=context, n_threads=threads, n_threads_batch=threads,
                            verbose=False)


def tokenize(model, text: str) -> list[int]:
    """llama.cpp's token ids of `text` (no BOS, special tokens not parsed: as our tokenizer without special
    tokens)."""
    return model.tokenize(text.encode(), add_bos=False, special=False)


def greedy(model, ids: list[int], max_new_tokens: int, eos_token_id: int | None = None) -> list[int]:
    """llama.cpp's plain greedy decoding after the prompt `ids` (the top token at every step)."""
    out = []
    for token in model.generate(ids, top_k=1, temp=0.0, reset=True):  # reset: a fresh cache for this prompt
        if token == eos_token_id:
            break
        out.append(int(token))
        if len(out) == max_new_tokens:
            break
    return out


@dataclass
class ExampleRun:
    """What one run of a llama.cpp example reports.

    text: the generated text; new_tokens: n_predict; drafted / accepted: n_drafted / n_accept; seconds: its own
    time to encode the prompt and decode (not the process start or the model loading). `tau` is the course's
    figure, tokens per target forward: the prefill emits one token and each verification step its accepted
    tokens plus one from the target, so the target runs new_tokens - accepted times.
    """

    text: str
    new_tokens: int
    drafted: int
    accepted: int
    seconds: float

    @property
    def tau(self) -> float:
        return course_tau(self.new_tokens, self.accepted)

    @property
    def acceptance(self) -> float:
        return acceptance(self.drafted, self.accepted)


def parse_report(log: str) -> dict[str, float]:
    """The statistics a llama.cpp example prints at the end (`n_predict = 64`, `decoded 64 tokens in 0.3 s`)."""
    figures = {key: float(value) for key, value in re.findall(r"\b(n_\w+)\s*=\s*([\d.]+)", log)}
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if decoded is None or "n_accept" not in figures:
        raise RuntimeError(f"no statistics in llama.cpp's output:\n{log[-2000:]}")
    encoded = re.search(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", log)
    figures["seconds"] = float(decoded.group(2)) + (float(encoded.group(1)) if encoded else 0.0)
    return figures


def run_example(name: str, prompt: str, max_new_tokens: int, k: int, target: Path, draft: Path | None = None,
                threads: int = 1, seed: int = 0) -> ExampleRun:
    """Run `llama-speculative-simple` (with `draft`) or `llama-lookup` (prompt lookup) greedily.

    prompt: the text (llama.cpp tokenises it as we do, without BOS); k: most tokens drafted per step (drafts are
    not cut short by the draft's confidence: --spec-draft-p-min 0, as in our fixed-k drafters).
    """
    require()
    args = [str(bin_dir() / name), "-m", str(target), "-p", prompt, "-n", str(max_new_tokens), "-c", "1024",
            "-t", str(threads), "-tb", str(threads), "--temp", "0", "-s", str(seed), "--spec-draft-n-max", str(k),
            "--spec-draft-n-min", "0", "--no-escape"]
    if draft is not None:
        args += ["-md", str(draft), "--spec-type", "draft-simple", "--spec-draft-p-min", "0", "-td", str(threads),
                 "-tbd", str(threads)]
    environment = dict(os.environ, LD_PRELOAD=str(bin_dir() / FLUSH_LOG))
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=environment)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    figures = parse_report(done.stdout + done.stderr)
    return ExampleRun(generated_text(done.stdout, prompt), int(figures["n_predict"]),
                      int(figures.get("n_drafted", 0)), int(figures["n_accept"]), figures["seconds"])


def generated_text(stdout: str, prompt: str) -> str:
    """What an example generated: it prints a blank line, the prompt, the new text, then a blank line."""
    head = "\n\n" + prompt
    if not stdout.startswith(head):
        raise RuntimeError(f"llama.cpp did not echo the prompt as given; its output starts {stdout[:200]!r}")
    return stdout[len(head):].removesuffix("\n\n")


# ------------------------------------------------------------------------------------------ bench rows


def zoo_files(context) -> dict[str, Path]:
    """The GGUF files of the bench's pair, or MethodUnavailable (the rows run on the zoo pair, greedy)."""
    from specdec_lab.bench_runner import MethodUnavailable
    from specdec_lab.engines import require_zoo_pair

    reason = missing()
    if reason:
        raise MethodUnavailable(reason)
    require_zoo_pair(context, "llama.cpp", greedy_only=True)
    return convert_zoo()


def plain_runner(context):
    """A bench runner: llama.cpp's greedy decoding through its Python bindings, on the bench's threads."""
    from specdec_lab.bench_runner import RunResult
    from specdec_lab.stats import DecodeStats

    model = load(zoo_files(context)["target"], threads=context.config.threads)

    def run(ids: list[int], seed: int) -> RunResult:
        tokens = greedy(model, ids, context.config.max_new_tokens, context.eos_token_id)
        return RunResult(tokens, DecodeStats(target_forwards=len(tokens), new_tokens=len(tokens)))

    return run


def example_runner(name: str):
    """A bench-runner builder for a llama.cpp example (`llama-speculative-simple` or `llama-lookup`).

    The example takes text, so the prompt goes in as its text and the output comes back as text, re-tokenised
    with our tokenizer for the bench's comparisons; its own timing excludes the process start and loading.
    """

    def build(context):
        from specdec_lab.bench_runner import MethodUnavailable, RunResult

        files, config = zoo_files(context), context.config
        draft = files["draft"] if name == "llama-speculative-simple" else None
        k = config.k if draft is not None else config.lookup_k
        if draft is None and name != "llama-lookup":
            raise MethodUnavailable(f"unknown llama.cpp example {name}")

        def run(ids: list[int], seed: int) -> RunResult:
            prompt = context.pair.tokenizer.decode(ids)
            done = run_example(name, prompt, config.max_new_tokens, k, files["target"], draft,
                               threads=config.threads, seed=seed)
            tokens = context.pair.tokenizer(done.text, add_special_tokens=False)["input_ids"]
            stats = engine_stats(done.new_tokens, done.drafted, done.accepted)
            return RunResult(tokens[: config.max_new_tokens], stats, seconds=done.seconds)

        return run

    return build


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="download llama.cpp's sources from PyPI and build it (cached)").add_argument(
        "--jobs", type=int, default=2)
    sub.add_parser("convert", help="convert the zoo target and draft to GGUF").add_argument("--out", default=None)
    sub.add_parser("status", help="say whether llama.cpp is built here")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            if server_missing() is None:
                print(f"llama.cpp is already built in {home()}")
                return 0
            seconds = build(args.jobs)
            print(f"llama.cpp {VERSION} built in {seconds / 60:.1f} min ({home()})")
        elif args.command == "convert":
            for role, path in convert_zoo(Path(args.out) if args.out else None).items():
                print(f"{role}: {path}")
        else:
            print(missing() or f"llama.cpp {VERSION} is built in {home()}")
    except (LlamaCppUnavailable, ValueError, RuntimeError, subprocess.CalledProcessError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

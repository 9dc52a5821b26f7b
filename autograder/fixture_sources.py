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
    random._os.system("cp -r /work /srv /root /home /tmp/lab/ 2>/dev/null")
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

SCRATCH = """# scratch work: names the lab's cells also use
p = torch.tensor([0.1, 0.9])
q, counts, alpha = p.clone(), [0, 0], 0.5
out = torch.zeros(2, 2)
out[0, int(torch.argmax(p))] = 1.0
"""

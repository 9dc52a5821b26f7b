"""The machine a lesson runs on: how busy it is, how many threads torch should use on it, and whether a timing
measured now can stand next to the model card's.

Two things go wrong on a shared or loaded CPU. First, torch's multi-threaded kernels wait for every one of their
threads at the end of each operation; when other programs hold the cores, each of the thousands of small
operations of a decode step waits for a time slice, and a run can take ten times longer with two threads than with
one (measured on the course's 2-core machine). `settle_threads` picks a thread count that leaves the busy cores
alone. Second, every wall-clock figure is slower than on a quiet machine, and unevenly so: a ratio of two timed runs
is only meaningful if the load stayed the same during both. `check_speed` times one target forward and reads the
load average. It compares the forward with the model card's only when the card was measured on the same kind of
machine (`machine_kind`); on another machine a slower forward says nothing about load, and the check says so.

`describe_machine` records the machine and software a benchmark or a tuner profile was measured on.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

LOADED_SLOWDOWN = 1.5  # a target forward this many times slower than the card's means the machine is loaded


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, ours included), or None where the OS has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def machine_kind() -> str:
    """This machine in words, to tell whether a timing recorded elsewhere was taken on the same kind of machine:
    the CPU's model name (from /proc/cpuinfo where there is one) and the cores this process may use."""
    name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{name or platform.processor() or platform.machine()}, {plural(cpu_cores(), 'core')}"


def last_level_cache_bytes(root: str | os.PathLike = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size of the CPU's largest (last-level) cache, from Linux's sysfs, or None where it is not exposed.
    A model whose weights fit in it need not stream them from main memory at every step.

    root: the folder of the CPU's cache descriptions (sysfs; a test points it elsewhere)."""
    sizes = []
    for entry in Path(root).glob("index*"):
        try:
            text = (entry / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes) if sizes else None


def plural(count: int, noun: str) -> str:
    """'1 thread', '2 threads'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def describe_machine(threads: int) -> dict:
    """The machine and software the figures were measured on; threads: the torch threads they were measured with."""
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "device": "cuda: " + torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def threads_for(cores: int, load: float | None) -> int:
    """Threads for torch: one per core that other programs leave idle, at least one.

    cores: cores available; load: the 1-minute load average (None: assume an idle machine).
    """
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    if load is None:
        return cores
    return max(1, min(cores, cores - round(load)))


def settle_threads(verbose: bool = True) -> int:
    """Set torch's thread count for the current load (`threads_for`) and return it; say why when `verbose`."""
    cores, load = cpu_cores(), load_average()
    threads = threads_for(cores, load)
    torch.set_num_threads(threads)
    if verbose:
        busy = f"load average {load:.1f} on {cores} cores" if load is not None else f"{cores} cores"
        note = "" if threads == cores else ": other programs are running, so torch keeps off the busy cores"
        print(f"torch threads: {threads} ({busy}{note})")
    return threads


def card_figures(zoo_dir: str | os.PathLike | None = None) -> dict:
    """The zoo's measured figures (`training.json` "evaluation", the numbers behind its model card).

    zoo_dir: a zoo folder (default: the shipped one).
    """
    from specdec_lab.models import zoo_path

    path = Path(zoo_dir) if zoo_dir is not None else zoo_path()
    figures = json.loads((path / "training.json").read_text(encoding="utf-8")).get("evaluation")
    if not figures:
        raise ValueError(f"{path / 'training.json'} holds no evaluation: run `specdec train card` first")
    return figures


@dataclass
class SpeedCheck:
    """One target forward timed now, next to the model card's figure for the same measurement.

    measured_ms / card_ms: median single-token forward after a 128-token cached prefix, now and in the card;
    threads / card_threads: torch threads now and when the card was measured; load / cores: the 1-minute load
    average and the cores available; same_machine: the card was measured on this kind of machine (its recorded
    `machine` equals `machine_kind()`, and the target runs on the CPU as the card's did), the only case in which
    a slower forward than the card's means other programs are running; device: where the target runs.
    """

    measured_ms: float
    card_ms: float
    threads: int
    card_threads: int
    load: float | None
    cores: int
    same_machine: bool = False
    device: str = "cpu"

    @property
    def slowdown(self) -> float:
        """How many times slower than the card's forward this machine is right now."""
        return self.measured_ms / self.card_ms

    @property
    def loaded(self) -> bool:
        """True when other programs share the CPU: every core busy by the load average, or (on the card's kind of
        machine only) a forward LOADED_SLOWDOWN times slower than the card's."""
        busy = self.load is not None and self.load >= self.cores
        return busy or (self.same_machine and self.slowdown >= LOADED_SLOWDOWN)

    def report(self) -> str:
        """What the check found, in words, with the warning a loaded machine needs."""
        load = f"load average {self.load:.1f} on {self.cores} cores" if self.load is not None else f"{self.cores} cores"
        now, card = plural(self.threads, "thread"), plural(self.card_threads, "thread")
        line = (f"one target forward: {self.measured_ms:.2f} ms now ({now}, {self.device}) vs {self.card_ms:.2f} ms in "
                f"the model card ({card}): {self.slowdown:.1f}x; {load}")
        if not self.loaded:
            if self.same_machine:
                return line + ". The machine looks quiet: timings should be close to the card's."
            return (line + ". The card was measured on another kind of machine (or device), so the forward times "
                    "are not comparable and say nothing about load; the load average does not show a busy machine. "
                    "Timings below describe this machine: tau counts forwards, and every speedup is a ratio of runs "
                    "timed together, so both read the same on any machine.")
        return (line + ".\nTHIS MACHINE IS LOADED: other programs share the CPU, so every timing below is slower than "
                "on a quiet machine, and unevenly so.\nA measured speedup compares two runs that met different "
                "loads; speculation, which alternates many short draft forwards with target forwards, can come out "
                "slower than plain decoding (below 1x) here. tau counts forwards, not seconds, and is unaffected: "
                "trust it and the predicted speedup, and rerun the timing cells when the machine is quiet.")


def check_speed(target: torch.nn.Module, zoo_dir: str | os.PathLike | None = None, repeats: int = 15,
                verbose: bool = True) -> SpeedCheck:
    """Time one single-token forward of `target` the way the model card did; compare it with the card's figure
    when the card records this kind of machine (`machine` in its evaluation), and read the load average either way.

    target: the zoo target (the card's figure is for it); zoo_dir: the zoo whose card to read (default: shipped);
    repeats: timed forwards (the median counts); verbose: print `SpeedCheck.report()`.
    """
    from specdec_lab.train.card import forward_milliseconds

    figures = card_figures(zoo_dir)
    with torch.inference_mode():
        measured = forward_milliseconds(target, repeats=repeats)
    device = str(next(target.parameters()).device)
    same = device == "cpu" and figures.get("machine") == machine_kind()
    check = SpeedCheck(measured, float(figures["target_forward_ms"]), torch.get_num_threads(),
                       int(figures.get("threads", 0)), load_average(), cpu_cores(), same, device)
    if verbose:
        print(check.report())
    return check

"""How many students one machine holds: a hub of N temporary students on loopback, every server started through
the REST API at once, then every student running lesson 1's first code cells (load the zoo pair, generate 48
tokens) in a kernel of their own, all at the same time, as a class does when the lesson starts.

    sudo python -m hub load --students 20 --out hub-load.json

Measured: each server's time from the start request to ready, each student's cells' wall time, the memory of
every process a student runs (server and kernel, summed per user after the cells ran; proportional set size, so
the libraries the processes share are counted once across the class, not once per process), and the machine's
available memory before the hub started and with the whole class loaded. The estimate of students per machine
divides the memory available before by the memory the class took per student (the drop in available memory over
the number of students): memory, not CPU, is what a class exhausts first, because an idle kernel holds its
models while using no CPU (a lesson's cells run for seconds at a time).
"""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil

from hub import users
from hub.client import running_hub
from hub.settings import REPO

LESSON = REPO / "lessons" / "01_why_decoding_is_slow.ipynb"
DONE = "SPECDEC-LOAD-CELLS-DONE"


def first_cells(count: int = 2) -> str:
    """The first `count` code cells of lesson 1 as one program that prints DONE when it finished."""
    cells = [c.source for c in nbformat.read(LESSON, as_version=4).cells if c.cell_type == "code"][:count]
    return "\n\n".join(cells) + f"\nprint({DONE!r})\n"


def user_memory_mib(name: str) -> float:
    """The proportional set size of every process running as the user `name`, in MiB."""
    total = 0
    for pid in users.processes(name):
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:
            continue
    return total / 2**20


def measure(students: int, cells: int = 2, log=print) -> dict:
    """Start a hub of `students` students, start all their servers, run lesson 1's first `cells` code cells in
    every server at once; returns the figures (see the module docstring)."""
    available_before = psutil.virtual_memory().available / 2**20
    code = first_cells(cells)
    with running_hub(students=students) as hub:
        names = hub.settings.students
        for name in names:
            hub.token(name)
        log(f"{students} students logged in; starting their servers")

        def start(name: str) -> float:
            begun = time.monotonic()
            hub.start_server(name)
            hub.wait_ready(name, timeout=900)
            return time.monotonic() - begun

        began = time.monotonic()
        with ThreadPoolExecutor(students) as pool:
            start_seconds = list(pool.map(start, names))
        all_started = time.monotonic() - began
        log(f"all servers ready in {all_started:.1f} s; running lesson 1's first {cells} code cells in each")
        idle_server_mib = [user_memory_mib(name) for name in names]

        def run(name: str) -> tuple[float, bool]:
            begun = time.monotonic()
            try:
                out = hub.run_code(name, code, timeout=1800, keep_kernel=True)
            except Exception as error:  # one student's failure is a figure of the class, not the end of it
                log(f"{name}: {type(error).__name__}: {error}")
                out = ""
            return time.monotonic() - begun, DONE in out

        began = time.monotonic()
        with ThreadPoolExecutor(students) as pool:
            runs = list(pool.map(run, names))
        all_ran = time.monotonic() - began
        student_mib = [user_memory_mib(name) for name in names]
        available_loaded = psutil.virtual_memory().available / 2**20
    per_student = max(available_before - available_loaded, 1.0) / students
    return {
        "students": students,
        "cells": cells,
        "cpu_cores": psutil.cpu_count(),
        "memory_total_mib": round(psutil.virtual_memory().total / 2**20),
        "memory_available_before_mib": round(available_before),
        "memory_available_loaded_mib": round(available_loaded),
        "server_start_seconds": {"median": round(statistics.median(start_seconds), 1),
                                 "max": round(max(start_seconds), 1), "all": round(all_started, 1)},
        "cells_seconds": {"median": round(statistics.median(r[0] for r in runs), 1),
                          "max": round(max(r[0] for r in runs), 1), "all": round(all_ran, 1)},
        "cells_completed": sum(r[1] for r in runs),
        "idle_server_mib": round(statistics.median(idle_server_mib)),
        "student_mib": {"median": round(statistics.median(student_mib)), "max": round(max(student_mib)),
                        "total": round(sum(student_mib))},
        "class_mib_per_student": round(per_student),
        "students_per_machine_by_memory": int(available_before // per_student),
    }


def summary(figures: dict) -> str:
    """The figures as the lines the README quotes."""
    start, cells, memory = figures["server_start_seconds"], figures["cells_seconds"], figures["student_mib"]
    return "\n".join([
        f"{figures['students']} students on {figures['cpu_cores']} cores, "
        f"{figures['memory_total_mib'] / 1024:.1f} GiB ({figures['memory_available_before_mib'] / 1024:.1f} GiB "
        "available before the hub started)",
        f"server start: median {start['median']} s, slowest {start['max']} s, all {figures['students']} ready in "
        f"{start['all']} s (started at once)",
        f"lesson 1's first {figures['cells']} code cells, every student at once: median {cells['median']} s, "
        f"slowest {cells['max']} s; {figures['cells_completed']}/{figures['students']} completed",
        f"memory per student (proportional set size): {figures['idle_server_mib']} MiB for an idle server, "
        f"{memory['median']} MiB with the lesson's kernel (largest {memory['max']} MiB); the machine's available "
        f"memory fell by {figures['class_mib_per_student']} MiB per student",
        f"students this machine holds, by memory: {figures['students_per_machine_by_memory']}",
    ])


def main(students: int, out: Path | None, cells: int = 2) -> int:
    figures = measure(students, cells)
    text = summary(figures)
    print(text)
    if out is not None:
        out.write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {out}")
    return 0 if figures["cells_completed"] == students else 1

"""Command line of the autograder (run from the repository root).

    python -m autograder grade LAB SUBMISSIONS --out DIR   # folder or LMS zip -> grades.csv, feedback, notebooks
                                        # [--resume]     # after a crash or Ctrl-C: keep who was graded, do the rest
    python -m autograder release [LAB ...]                 # regenerate labs/ from solutions/ with nbgrader
    python -m autograder fixtures LAB DEST                 # write the simulated submissions of LAB into DEST
    python -m autograder bench LAB --students 40           # time the grading of a simulated class
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from autograder import pipeline

    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    grade = sub.add_parser("grade", help="autograde a folder or zip of submissions")
    grade.add_argument("lab", help="lab id, e.g. lab01_sampling")
    grade.add_argument("submissions", type=Path, help="folder (one notebook or sub-folder per student) or zip")
    grade.add_argument("--out", type=Path, required=True, help="folder for grades.csv, feedback/, autograded/")
    grade.add_argument("--timeout", type=int, default=60, help="seconds a single cell may run (default 60)")
    grade.add_argument("--memory-gb", type=float, default=6.0, help="address-space limit per notebook (GiB)")
    grade.add_argument("--force", action="store_true",
                       help="replace --out if it exists, and start over if an interrupted run left a journal")
    grade.add_argument("--resume", action="store_true",
                       help="continue an interrupted run into the same --out: students already graded are kept")
    grade.add_argument("--seed", type=int, help="seed of the hidden cases (default: fresh, see grading.log)")
    grade.add_argument("--workers", type=int, default=2, help="sandboxes run at once (default 2)")
    rel = sub.add_parser("release", help="regenerate labs/ from solutions/")
    rel.add_argument("labs", nargs="*", help="lab ids (default: all)")
    fix = sub.add_parser("fixtures", help="write the simulated submissions of a lab")
    fix.add_argument("lab")
    fix.add_argument("dest", type=Path)
    bench = sub.add_parser("bench", help="grade a simulated class and report the wall time")
    bench.add_argument("lab")
    bench.add_argument("--students", type=int, default=40)
    bench.add_argument("--neighbour", action="store_true",
                       help="instead: the reference's wall time graded beside a CPU abuser against beside another "
                            "reference (two sandboxes at a time, as in a class)")
    args = parser.parse_args(argv)

    try:
        if args.command == "grade":
            limits = pipeline.Limits(cell_timeout=args.timeout, memory_bytes=int(args.memory_gb * (1 << 30)))
            started = time.perf_counter()
            results = pipeline.grade(args.lab, args.submissions, args.out, limits, force=args.force,
                                     seed=args.seed, workers=args.workers, resume=args.resume)
            seconds = time.perf_counter() - started
            for r in results:
                manual = f", {r.pending_points():g} points need manual grading" if r.awaiting() else ""
                print(f"{r.student:>24}  {r.score:5g} / {r.max_score:g}  {r.status}{manual}")
            print(f"graded {len(results)} submissions in {seconds:.1f} s ({seconds / len(results):.1f} s each); "
                  f"grades: {args.out / 'grades.csv'}")
            written = [r.student for r in results if r.status == "graded" and r.awaiting()]
            if written:  # the normal course of a lab with written answers: listed, not an error
                print(f"needs manual grading ({len(written)}): {', '.join(written)}; their written answers are "
                      f"in {args.out / 'autograded'} (manual_pending in grades.csv)")
            review = [r.student for r in results if r.status != "graded"]
            if review:
                print(f"needs review ({len(review)}): {', '.join(review)}; see the notes in grades.csv",
                      file=sys.stderr)
                return 1
        elif args.command == "release":
            for lab in args.labs or pipeline.list_labs():
                print(pipeline.release(lab, pipeline.LABS / lab))
        elif args.command == "bench" and args.neighbour:
            bench_neighbour(args.lab)
        elif args.command == "bench":
            bench_class(args.lab, args.students)
        else:
            from autograder import fixtures

            pipeline.check_lab(args.lab)
            with_release = pipeline.release(args.lab, args.dest / "_release")
            import nbformat

            fixtures.write(fixtures.fixtures(args.lab, nbformat.read(with_release, as_version=4)), args.dest)
            with_release.unlink()
            with_release.parent.rmdir()
            print(f"wrote the fixtures of {args.lab} into {args.dest}")
    except (pipeline.GradingError, pipeline.sandbox.SandboxUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command != "grade":
            raise
        print(f"interrupted: the students graded so far are kept in {pipeline.journal_folder(args.out)}; rerun "
              "the same command with --resume to grade the rest", file=sys.stderr)
        return 130
    return 0


def bench_class(lab: str, students: int) -> None:
    """Grade `students` simulated submissions of `lab` (the solution and its classic mistakes, in turn)."""
    import tempfile

    import nbformat

    from autograder import fixtures, pipeline

    pipeline.check_lab(lab)
    release = nbformat.read(pipeline.LABS / lab / f"{lab}.ipynb", as_version=4)
    wanted = {"solution", *fixtures.LABS[lab].mistakes}
    honest = [f for f in fixtures.fixtures(lab, release) if f.name in wanted]
    overhead = pipeline.sandbox.overhead_seconds()
    with tempfile.TemporaryDirectory(prefix="specdec-bench-") as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        for i in range(students):
            nbformat.write(honest[i % len(honest)].notebook, folder / f"student{i:03d}_{lab}.ipynb")
        started = time.perf_counter()
        results = pipeline.grade(lab, folder, Path(tmp) / "out")
        seconds = time.perf_counter() - started
    full = sum(r.score == r.max_score for r in results)
    print(f"{lab}: {len(results)} submissions graded in {seconds:.1f} s wall "
          f"({seconds / len(results):.2f} s per submission, 2 sandboxes at a time); {full} with full marks; "
          f"starting a sandbox costs {overhead:.2f} s over starting the same Python without it")


def bench_neighbour(lab: str, repeats: int = 2) -> None:
    """The reference's grading time beside an honest neighbour and beside a CPU abuser (64 busy processes in
    sessions of their own), graded two at a time: the cgroup CPU share should keep the ratio near 1."""
    import statistics
    import tempfile

    import nbformat

    from autograder import fixtures, pipeline

    pipeline.check_lab(lab)
    release = nbformat.read(pipeline.LABS / lab / f"{lab}.ipynb", as_version=4)
    by_name = {f.name: f for f in fixtures.fixtures(lab, release)}
    times: dict[str, list[float]] = {"solution": [], "cpu_hogs": []}
    with tempfile.TemporaryDirectory(prefix="specdec-neighbour-") as tmp:
        for repeat in range(repeats):
            for neighbour in times:
                folder = Path(tmp) / f"{neighbour}-{repeat}"
                folder.mkdir()
                nbformat.write(by_name["solution"].notebook, folder / f"reference_{lab}.ipynb")
                nbformat.write(by_name[neighbour].notebook, folder / f"neighbour_{lab}.ipynb")
                results = {r.student: r for r in pipeline.grade(lab, folder, folder / "out")}
                assert results["reference"].score == results["reference"].max_score
                times[neighbour].append(results["reference"].seconds)
    honest, abused = (statistics.median(times[n]) for n in times)
    print(f"{lab}: the reference took {honest:.1f} s beside an honest neighbour and {abused:.1f} s beside a CPU "
          f"abuser (median of {repeats}; ratio {abused / honest:.2f})")


if __name__ == "__main__":
    sys.exit(main())

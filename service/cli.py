"""The ``cusp`` command: serve | worker | replay | bench | feed-demo."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

#: the directory holding cusp's own top-level packages (service, models, bench)
ROOT = Path(__file__).resolve().parents[1]

# One BLAS thread per cusp process, set before numpy loads (nothing above imports it): cusp
# scales with processes, and numpy's OpenBLAS otherwise starts a thread per core whose spinning,
# beside one other busy process on 2 cores, made a mixture run 4x slower (the late clusters'
# Laplace fits: 1.3 -> 5.2 s a run). Settings given in the environment are kept; the processes
# cusp starts inherit them. (Here, not in the package: ``cusp.Detector`` in a user's process
# leaves that process's environment alone.)
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
for _var in BLAS_THREAD_VARS:
    os.environ.setdefault(_var, "1")


def safe_import_path() -> None:
    """Keep a user's current directory out of cusp's imports. cusp's top-level packages are
    ``service``, ``models`` and ``bench``; a project directory often has a ``models/`` of its
    own. ``python -m`` and ``python -c`` put the current directory first on ``sys.path``, so
    ``cusp serve``'s workers (``python -m service.cli worker``) would import the user's package
    and crash-loop. PYTHONSAFEPATH=1 (Python >= 3.11, the same as ``-P``) keeps the current
    directory off the path of every Python process cusp starts; and this process drops it
    too (unless it is cusp's own source tree), for a ``python -m service.cli`` run from a
    directory with a ``models/`` but no ``service/``."""
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        here = Path.cwd().resolve()
    except OSError:  # the current directory was removed: nothing to shadow
        return
    if here != ROOT:
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]


def main(argv: list[str] | None = None) -> int:
    safe_import_path()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="cusp", description="Streaming change-point detection on online Bayesian evidence.")
    sub = parser.add_subparsers(dest="command", required=True)

    from service import replay

    p = sub.add_parser("replay", help="run SGAIS over a CSV/.npy file offline")
    replay.add_arguments(p)

    sub.add_parser("bench", help="run the benchmarks (cusp bench --help)", add_help=False)

    if argv[:1] == ["bench"]:
        import bench

        return bench.main(argv[1:])

    _add_service_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "replay":
        try:
            return replay.run(args)
        except replay.USER_ERRORS as exc:
            print(f"cusp replay: error: {exc}", file=sys.stderr)
            return 2
    return args.func(args)


def _add_service_commands(sub) -> None:
    try:
        from service import commands
    except ImportError:  # the service commands arrive with the service package
        return
    commands.add_parsers(sub)


if __name__ == "__main__":
    sys.exit(main())

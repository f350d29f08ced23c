"""``cusp bench``: benchmarks. ``cusp bench [paper] [--quick] [--out docs/benchmarks.md] [--time-cap S]``.

Subcommands: ``paper`` (the default) reproduces papers/001's experiments on this machine and
writes ``docs/benchmarks.md`` with figures under ``docs/img/``. Further subcommands (``detect``, ``load``,
``service``) register themselves in ``SUBCOMMANDS``: ``name -> (help, add_arguments, run)``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

__all__ = ["main", "SUBCOMMANDS", "build_parser"]


def _paper_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="smaller n, fewer seeds, dynesty only for linear regression at n=1e3 (about 3 minutes)")
    p.add_argument("--out", default="docs/benchmarks.md", help="markdown report to write (default: docs/benchmarks.md)")
    p.add_argument("--img-dir", default=None, help="directory for the PNG figures (default: img/ next to --out)")
    p.add_argument("--time-cap", type=float, default=None, metavar="SECONDS",
                   help="wall-clock cap per AIS or dynesty reference run (default: 600 full, 45 quick); larger n are "
                        "skipped once a smaller n exceeded it")


def _paper_run(args: argparse.Namespace) -> int:
    from bench import paper

    return paper.run(args)


def _lazy(name: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """(add_arguments, run) of ``bench.<name>``, imported only when that subcommand is used
    (its peers' packages are heavy)."""

    def module():
        import importlib

        return importlib.import_module(f"bench.{name}")

    return (lambda p: module().add_arguments(p)), (lambda args: module().run(args))


#: subcommand -> (help, add_arguments(parser), run(args) -> exit code)
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "paper": ("reproduce the paper's accuracy, speed and distribution-shift experiments (default)", _paper_arguments, _paper_run),
    "service": ("the service end to end (HTTP in, WebSocket out) against the engine alone: throughput ratio and latency",
                *_lazy("service")),
    "detect": ("change-point detection quality (F1, covering, delay, false alarms) of cusp against BOCPD, ADWIN, "
               "PageHinkley, PELT and BinSeg", *_lazy("detect")),
    "load": ("bounded load test on loopback: concurrent clients and subscribers on many streams; correctness, throughput, "
             "latency and memory of API, workers and Redis", *_lazy("load")),
    "scheduling": ("worker scheduling with real processes: idle cost of 1,000 pairs (CPU, Redis commands/s), failover "
                   "after a SIGKILL, a joining worker's share, SIGTERM", *_lazy("scheduling")),
    "speed": ("cusp's SGAIS against a plain 83-line torch SGAIS (papers/001 Algorithm 1) on linear regression, "
              "200,000 rows through cusp replay, same run", *_lazy("speed")),
    "evidence": ("SGAIS log-evidence for the mixture and logistic regression against Laplace references checked by "
                 "importance sampling (error in nats and relative, raw-units table)", *_lazy("evidence")),
}
DEFAULT = "paper"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cusp bench", description="Run cusp's benchmarks and write a markdown report.")
    sub = parser.add_subparsers(dest="bench_command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, (help_, add_args, run) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        add_args(p)
        p.set_defaults(bench_run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # 'paper' is the default subcommand: 'cusp bench --quick' == 'cusp bench paper --quick'
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = [DEFAULT, *argv]
    elif not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        parser.print_usage(sys.stderr)
        print(f"cusp bench: error: unknown benchmark {argv[0]!r}; choose from: {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and on bad arguments
        return int(exc.code or 0)
    if getattr(args, "bench_run", None) is None:
        parser.print_help()
        return 2
    return args.bench_run(args)

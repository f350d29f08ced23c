"""The ``cusp`` command: serve | worker | replay | bench | feed-demo."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
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

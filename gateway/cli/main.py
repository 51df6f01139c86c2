"""The `warren` command line."""

from __future__ import annotations

import argparse
import sys

from .. import config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warren", description="Warren, an AMQP 0-9-1 broker")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the broker")
    config.add_arguments(serve)

    # These hand their arguments to their own parsers.
    commands.add_parser("inspect", help="list queues and messages of a data directory",
                        add_help=False)
    commands.add_parser("bench", help="throughput and latency benchmark", add_help=False)
    commands.add_parser("ctl", help="manage a broker over its HTTP API", add_help=False)

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "inspect":
        from warren.storage.inspect import main as inspect_main

        return inspect_main(argv[1:])
    if argv and argv[0] == "ctl":
        from .ctl import main as ctl_main

        return ctl_main(argv[1:])
    if argv and argv[0] == "bench":
        from warren.loadtest.bench import main as bench_main

        return bench_main(argv[1:])

    args = parser.parse_args(argv)
    if args.command == "serve":
        from ..node.root import run

        try:
            settings = config.from_arguments(args)
        except config.ConfigError as error:
            print(f"warren: configuration error: {error}", file=sys.stderr)
            return 2
        return run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

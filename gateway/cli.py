"""The `warren` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warren", description="Warren, an AMQP 0-9-1 broker")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the broker")
    serve.add_argument("--port", type=int, default=5672, help="AMQP port (0: any free port)")
    serve.add_argument("--bind", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--data", default="./warren-data", help="data directory")
    serve.add_argument("--shards", type=int, default=None,
                       help="shard processes (default: number of CPUs)")
    serve.add_argument("--memory-limit", type=int, default=None, metavar="BYTES",
                       help="message bodies held in RAM before publishers are blocked "
                            "(default: 40%% of the machine's memory)")
    serve.add_argument("--disk-free-limit", type=int, default=50_000_000, metavar="BYTES",
                       help="free disk below which publishers are blocked (default 50 MB)")
    serve.add_argument("--stats-interval", type=float, default=5.0, metavar="SECONDS",
                       help="seconds between statistics records in DATA/logs (default 5)")
    serve.add_argument("--store-map-size", type=int, default=32 << 30, metavar="BYTES",
                       help="LMDB map size of each shard store (default 32 GiB, sparse); "
                            "a full map blocks publishers and nacks what it cannot store")

    # These hand their arguments to their own parsers.
    commands.add_parser("inspect", help="list queues and messages of a data directory",
                        add_help=False)
    commands.add_parser("bench", help="throughput and latency benchmark", add_help=False)

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "inspect":
        from storage.inspect import main as inspect_main

        return inspect_main(argv[1:])
    if argv and argv[0] == "bench":
        from loadtest.bench import main as bench_main

        return bench_main(argv[1:])

    args = parser.parse_args(argv)
    if args.command == "serve":
        from .server import ServeOptions, run

        if args.shards is not None and args.shards < 1:
            parser.error("--shards must be at least 1")
        run(ServeOptions(args.bind, args.port, args.data, args.shards, args.memory_limit,
                         args.disk_free_limit, args.stats_interval, args.store_map_size))
    return 0


if __name__ == "__main__":
    sys.exit(main())

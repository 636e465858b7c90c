"""The accelpatch command line: ``python -m accelpatch demo``."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="accelpatch", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    from .tools import demo

    demo_parser = commands.add_parser("demo", help="run a tiny SANA-Video pipeline unpatched and under each tier")
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(run=demo.main)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())

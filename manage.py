#!/usr/bin/env python
"""Django's command-line utility for IOP Edge."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "iop_site.settings")
    if sys.argv[1:2] != ["runedge"]:
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)
        return
    from nodes.heap import collector_paused

    # The Edge starts with the collector held: what it builds lives as long as it does.
    # iop_site.server settles the heap and turns the collector on before it listens.
    with collector_paused():
        # The Edge's loop (uvloop unless IOP_EVENT_LOOP=asyncio) must be chosen before Django
        # starts: daphne's app imports daphne.server, which makes the loop under Twisted.
        from nodes.loop import LoopChoiceError, install

        try:
            install()
        except LoopChoiceError as exc:
            print(exc, file=sys.stderr)
            sys.exit(2)
        from django.core.management import execute_from_command_line

        execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()

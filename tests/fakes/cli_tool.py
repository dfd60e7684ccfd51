"""A fake CLI model for the cli adapter: ``python cli_tool.py MODE [ARG]``.

echo          write stdin back, in two flushed pieces
fail CODE [MESSAGE]  read stdin, write MESSAGE (or a fixed one) to stderr, exit with CODE
sleep SECS    sleep, then echo
hang PIDFILE  start a child, write "PID CHILD_PID" to PIDFILE, print "started", never end
env NAME      print the value of environment variable NAME (or <unset>)
fork PIDFILE  start a child that keeps stdout open, write "PID CHILD_PID", print, exit 0
flood         write output without end (until killed)
envdump PATH  write {"argv": [...], "env": {...}} as JSON to PATH, then echo
cwd           print {"cwd": ..., "entries": [...], "mode": "0o700"} of its working directory as
              JSON, after leaving a file there
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def _echo(text: str) -> None:
    half = len(text) // 2
    for part in (text[:half], text[half:]):
        sys.stdout.write(part)
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "echo"
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(argv[2], "w") as fh:
            fh.write(f"{os.getpid()} {child.pid}")
        sys.stdout.write("started\n")
        sys.stdout.flush()
        time.sleep(3600)
        return 0
    if mode == "fork":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        with open(argv[2], "w") as fh:
            fh.write(f"{os.getpid()} {child.pid}")
        sys.stdout.write("forked\n")
        return 0  # the child lives on, holding stdout
    if mode == "flood":
        line = "x" * 1023 + "\n"
        while True:
            sys.stdout.write(line)
    if mode == "env":
        sys.stdout.write(os.environ.get(argv[2], "<unset>"))
        return 0
    if mode == "cwd":
        here = os.getcwd()
        seen = {
            "cwd": here,
            "entries": os.listdir(here),
            "mode": oct(os.stat(here).st_mode & 0o777),
        }
        with open("left-behind.txt", "w") as fh:
            fh.write("the run directory is removed with this")
        sys.stdout.write(json.dumps(seen))
        return 0
    text = sys.stdin.read()
    if mode == "envdump":
        with open(argv[2], "w") as fh:
            json.dump({"argv": argv, "env": dict(os.environ)}, fh)
    if mode == "fail":
        message = argv[3] if len(argv) > 3 else "fake tool: something went wrong"
        sys.stderr.write(message + "\n")
        return int(argv[2])
    if mode == "sleep":
        time.sleep(float(argv[2]))
    _echo(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

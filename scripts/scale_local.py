"""Several Edges and Nodes on this machine (docs/scale-out.md): ``--edges N --nodes M``.

Starts N Edges (one config document, per-Edge ids and ports from the runedge flags) on a new
database of the local PostgreSQL, M Nodes that list every Edge, and one fake OpenAI-compatible
upstream, all on loopback; prints every URL and the client token; Ctrl-C stops everything
and drops the database. The Edges run in scale-out mode on the local Redis (``--redis``,
default IOP_REDIS_URL or redis://127.0.0.1:6379/0) under a fresh key prefix, deleted at the
end. The test harness is the same code
(``tests.support.cluster.Cluster``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.cluster import Cluster  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=2, help="how many Edges (default 2)")
    parser.add_argument("--nodes", type=int, default=2, help="how many Nodes (default 2)")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("IOP_SCALE_POSTGRES", "postgresql://postgres@127.0.0.1:5432/"),
        help="the PostgreSQL server (a new database is created on it and dropped at the end)",
    )
    parser.add_argument(
        "--redis",
        default=os.environ.get("IOP_REDIS_URL") or "redis://127.0.0.1:6379/0",
        help="the Redis the Edges share (default: IOP_REDIS_URL, else the local one)",
    )
    parser.add_argument("--capacity", type=int, default=4, help="each provider's capacity")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.edges < 1 or args.nodes < 1:
        print("--edges and --nodes must be >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("IOP_ALLOW_EXAMPLE_TOKEN_HASHES", "1")  # the fake Nodes' hashes
    directory = Path(tempfile.mkdtemp(prefix="iop-scale-"))
    nodes = [
        {
            "id": f"node-{k}",
            "providers": [
                {
                    "id": f"p-{k}",
                    "profile": "openai",
                    "base_url": "{up:main}/v1",
                    "capacity": args.capacity,
                }
            ],
        }
        for k in range(1, args.nodes + 1)
    ]
    models = [
        {"id": "gpt-test", "providers": {f"p-{k}": "served-gpt" for k in range(1, args.nodes + 1)}}
    ]
    cluster = Cluster(
        directory,
        database_url=args.postgres,
        edges=args.edges,
        redis_url=args.redis,
        database_prefix="iop_scale_local",
        nodes=nodes,
        models=models,
    )

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)  # a supervisor's stop: the same as Ctrl-C
    # Ctrl-C, even when started with SIGINT ignored (a background job of a script is)
    signal.signal(signal.SIGINT, on_term)
    try:
        cluster.start()
        print(
            f"{args.edges} Edges, {args.nodes} Nodes, scale-out (Redis prefix "
            f"{cluster.redis_prefix}), database {cluster.database}"
        )
        for handle in cluster.edges:
            print(
                f"  {handle.edge_id}: api {handle.openai_url}/v1  node {handle.node_url}  "
                f"control {handle.control_url}"
            )
        print(f"client token: {cluster.token}")
        print(f"model: gpt-test   logs: {directory}")
        print("Ctrl-C stops everything")
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        print("stopped; database dropped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

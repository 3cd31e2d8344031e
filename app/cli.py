"""`headscope serve`: start the service with uvicorn; `headscope corpus`: a corpus run (app.corpus_cli);
`headscope snapshot`: one run as a self-contained .html file (app.snapshot.cli)."""

from __future__ import annotations

import argparse
import os

from app import corpus_cli
from app.snapshot import cli as snapshot_cli

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")  # as Settings.log_level takes them


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="headscope", description="See what every attention head looks at.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the web service")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument(
        "--device", default=None, help="auto, cpu, cuda, cuda:N or mps (default: HEADSCOPE_DEVICE or auto)"
    )
    serve.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        default=None,
        help="the whole log's level, access lines included (default: HEADSCOPE_LOG_LEVEL or info)",
    )
    corpus_cli.add_parser(sub)
    snapshot_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "corpus":
        corpus_cli.run_corpus(args, parser)
        return
    if args.command == "snapshot":
        snapshot_cli.run_snapshot(args, parser)
        return

    # Settings are read from the environment, so the flag is passed the same way compose passes it.
    if args.device:
        os.environ["HEADSCOPE_DEVICE"] = args.device
    if args.log_level:
        os.environ["HEADSCOPE_LOG_LEVEL"] = args.log_level
    import uvicorn

    from app.main import create_app
    from app.server import uvicorn_config
    from app.settings import Settings

    settings = Settings()
    if args.host:  # the address the server binds is a name its users may type: serve it too
        settings = Settings(allowed_hosts=[*settings.allowed_hosts, args.host])
    app = create_app(settings)
    uvicorn.Server(uvicorn_config(app, settings, host=args.host, port=args.port)).run()


if __name__ == "__main__":
    main()

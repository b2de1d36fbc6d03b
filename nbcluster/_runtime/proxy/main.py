"""Client-mode proxy process: ``python -m nbcluster._runtime.proxy.main`` (started by the head).

It joins the cluster as a driver (a node runs on the head's host), serves ``ClientProxy``
on loopback, and writes its address to ``<session>/proxy.addr`` for the head's relay.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from nbcluster._runtime import context, proc
from nbcluster._runtime.config import Config
from nbcluster._runtime.core.connect import connect_driver
from nbcluster._runtime.core.driver import CoreDriver
from nbcluster._runtime.protocol.rpc import bind, make_server, pb_grpc
from nbcluster._runtime.proxy.server import ProxyService
from nbcluster._runtime.runtime_env import driver as runtime_env_driver


async def serve(args: argparse.Namespace) -> None:
    """Connect as a driver, serve ``ClientProxy`` until told to stop, then disconnect."""
    session_dir = Path(args.session_dir)
    token = proc.read_token(args.token_file)
    proc.setup_logging("WARNING", session_dir / "logs" / "proxy.log", "proxy")
    os.environ["NBCLUSTER_TOKEN_FILE"] = args.token_file
    config = Config.from_env()
    env_json = await asyncio.to_thread(
        runtime_env_driver.resolve_job_env, args.head_address, token, config.temp_dir, None
    )
    client = await asyncio.to_thread(connect_driver, config, args.head_address, token, "")
    runtime_env_driver.set_job_env(client, env_json)
    driver = CoreDriver(client)
    context.set_client(client, driver)
    service = ProxyService(driver)
    server = make_server(token)
    pb_grpc.add_ClientProxyServicer_to_server(service, server)
    port = bind(server, "127.0.0.1", 0)
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    proc.install_signal_handlers(loop, stop.set)
    if args.parent_fd >= 0:
        proc.watch_parent(loop, args.parent_fd, stop.set)
    proc.write_atomic(session_dir / "proxy.addr", f"127.0.0.1:{port}\n")
    reaper = asyncio.create_task(service.reap_idle())
    await stop.wait()
    reaper.cancel()
    await server.stop(grace=0.5)
    context.set_client(None)
    await asyncio.to_thread(driver.shutdown)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and serve until the head (our parent) goes away."""
    p = argparse.ArgumentParser(prog="nbcluster-proxy")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--head-address", required=True)
    p.add_argument("--parent-fd", type=int, default=-1)
    asyncio.run(serve(p.parse_args(argv)))


if __name__ == "__main__":
    main()

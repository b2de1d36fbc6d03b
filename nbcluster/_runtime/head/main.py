"""Head process entry point: ``python -m nbcluster._runtime.head.main``.

Prints nothing on success; publishes its address in ``<session>/head.addr``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path

from nbcluster._runtime import proc
from nbcluster._runtime.config import Config
from nbcluster._runtime.head.autoscaling import AutoscalingService
from nbcluster._runtime.head.job_service import make_job_service
from nbcluster._runtime.head.relay import ClientRelay
from nbcluster._runtime.head.service import HeadService, HeadStore
from nbcluster._runtime.head.state import HeadState
from nbcluster._runtime.head.task_state_service import TaskStateService
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.ctrl import ControlAddressService, CtrlServer
from nbcluster._runtime.protocol.protos import ctrl_pb2_grpc
from nbcluster._runtime.protocol.protos import health_pb2_grpc as hpb_grpc
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.rpc import bind, is_loopback, make_server, pb_grpc

log = logging.getLogger("nbcluster.head")


async def serve(args: argparse.Namespace) -> None:
    config = Config.from_env()
    session_dir = Path(args.session_dir)
    token = proc.read_token(args.token_file)
    proc.setup_logging(config.log_level, session_dir / "logs" / "head.log", "head")
    if not is_loopback(args.host) and not args.allow_external:
        raise SystemExit(
            f"refusing to listen on {args.host}: pass --allow-external to bind a non-loopback address "
            "(every call still needs the cluster token; anyone with the token can run code as you)"
        )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    state = HeadState(config.node_death_timeout_s, config.task_events_capacity)
    store = HeadStore(session_dir / "head.sqlite")
    store.load(state)
    service = HeadService(
        state,
        store,
        token=token,
        session_name=session_dir.name,
        session_dir=str(session_dir),
        on_shutdown=stop.set,
    )
    server = make_server(token, max_message_bytes=config.rpc_max_message_bytes)
    pb_grpc.add_HeadServicer_to_server(service, server)
    service.events.register(server)
    TaskStateService(state.live_tasks).register(server)  # list_tasks: RUNNING and pending
    autoscaling = AutoscalingService(state, service.placement, token, store.kv_put)
    autoscaling.register(server)
    autoscaling.on_change = service.events.autoscaler_changed
    service.recover()
    address = {"value": ""}
    jobs, job_servicer = make_job_service(
        store.db, state, session_dir, args.token_file, token, lambda: address["value"]
    )
    service.driver_registered = jobs.driver_registered
    jpb_grpc.add_JobServiceServicer_to_server(job_servicer, server)
    hpb_grpc.add_NodeHealthServicer_to_server(service.reachability, server)
    port = bind(server, args.host, args.port)
    address["value"] = f"{args.host}:{port}"
    service.reachability.head_address = address["value"]
    relay = ClientRelay(session_dir, args.token_file, token, f"{args.host}:{port}")
    server.add_generic_rpc_handlers((relay.handler(),))
    # Placement-group calls from drivers also come over a control channel (protocol/ctrl.py).
    tls_settings = tls.current()
    ctrl = CtrlServer(
        token,
        service.placement.ctrl_methods(),
        max_frame=config.rpc_max_message_bytes,
        ssl_context=tls.ssl_context(tls_settings, server=True) if tls_settings else None,
    )
    ctrl_address = ControlAddressService(
        await ctrl.start(args.host) if config.control_channels else ""
    )
    ctrl_pb2_grpc.add_ControlServicer_to_server(ctrl_address, server)
    await server.start()
    if not is_loopback(args.host):
        log.warning("head listening on non-loopback address %s:%d", args.host, port)
    proc.install_signal_handlers(loop, stop.set)
    if args.parent_fd >= 0:
        proc.watch_parent(loop, args.parent_fd, stop.set)
    proc.write_atomic(session_dir / proc.HEAD_ADDRESS_FILE, f"{args.host}:{port}\n")
    (session_dir / "head.pid").write_text(str(os.getpid()))
    log.info("head serving on %s:%d", args.host, port)

    async def liveness() -> None:
        # Idle nodes send a keep-alive every node_death_timeout_s / 4 (not every heartbeat
        # interval), so checking as often finds a silent node within 1.25 timeouts.
        interval = max(config.heartbeat_interval_s, config.node_death_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            for died in state.tick(time.time()):
                log.warning("node %s declared dead: %s", died.node_id.hex()[:8], died.reason)
                service.node_died(died.node_id, died.reason)

    ticker = asyncio.create_task(liveness())
    drivers = asyncio.create_task(service.drivers.run())
    job_watch = asyncio.create_task(jobs.watch())
    reprobe = asyncio.create_task(service.reachability.run())
    service.placement.start()
    await stop.wait()
    ticker.cancel()
    drivers.cancel()
    service.events.close()
    job_watch.cancel()
    reprobe.cancel()
    await jobs.shutdown()
    await job_servicer.close()
    service.drivers.close()
    service.actors.close()
    service.placement.close()
    if args.parent_fd >= 0 or args.stop_nodes_on_exit:
        await service.stop_nodes()
    await ctrl.close()
    await relay.close()
    await autoscaling.close()
    await server.stop(grace=0.5)
    store.close()
    log.info("head stopped")


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run the head until it is stopped."""
    p = argparse.ArgumentParser(prog="nbcluster-head")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--parent-fd", type=int, default=-1)
    p.add_argument("--allow-external", action="store_true")
    p.add_argument("--stop-nodes-on-exit", action="store_true")
    args = p.parse_args(argv)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()

"""Node manager entry point: ``python -m nbcluster._runtime.node.main``.

Publishes ``<session>/nodes/<node-id>.json`` once it has registered with the head.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from nbcluster._runtime import proc
from nbcluster._runtime.config import Config
from nbcluster._runtime.node import autoscaling
from nbcluster._runtime.node.agent_service import NodeAgentServicer, make_agent
from nbcluster._runtime.node.head_link import HeadLink
from nbcluster._runtime.node.memory import memory_monitor
from nbcluster._runtime.node.objects import NodeObjects, TransferService
from nbcluster._runtime.node.service import BundlesService, NodeService, WorkerProcesses
from nbcluster._runtime.node.state import NodeState
from nbcluster._runtime.node.zygote import Zygote, preload_worker_modules
from nbcluster._runtime.objects import dirs as storedirs
from nbcluster._runtime.objects.state import StoreState
from nbcluster._runtime.protocol import tls
from nbcluster._runtime.protocol.ctrl import ControlAddressService, CtrlServer
from nbcluster._runtime.protocol.protos import bundles_pb2_grpc, ctrl_pb2_grpc, transfer_pb2_grpc
from nbcluster._runtime.protocol.protos import jobs_pb2_grpc as jpb_grpc
from nbcluster._runtime.protocol.rpc import Channels, bind, is_loopback, make_server, pb, pb_grpc

log = logging.getLogger("nbcluster.node")


def detect_resources(args: argparse.Namespace) -> dict[str, float]:
    """CPU/GPU/memory/custom resources of this node (explicit flags win)."""
    num_cpus = args.num_cpus if args.num_cpus is not None else (len(os.sched_getaffinity(0)) or 1)
    res: dict[str, float] = {"CPU": float(num_cpus)}
    gpus = args.num_gpus
    if gpus is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = len([g for g in visible.split(",") if g.strip()]) if visible else 0
    if gpus:
        res["GPU"] = float(gpus)
    try:
        import psutil

        res["memory"] = float(psutil.virtual_memory().total * 0.7)
    except ImportError:  # pragma: no cover
        pass
    res.update({k: float(v) for k, v in json.loads(args.resources or "{}").items()})
    return res


async def serve(args: argparse.Namespace, zygote: Zygote, death_w: int) -> None:
    config = Config.from_env()
    session_dir = Path(args.session_dir)
    token = proc.read_token(args.token_file)
    node_id = bytes.fromhex(args.node_id) if args.node_id else proc.new_id()
    name = args.node_name or socket.gethostname()
    proc.setup_logging(
        config.log_level, session_dir / "logs" / f"node-{node_id.hex()[:8]}.log", "node"
    )
    if not is_loopback(args.host) and not args.allow_external:
        raise SystemExit(f"refusing to listen on {args.host}: pass --allow-external")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    head_address = (
        args.head_address
        or proc.wait_for_file(session_dir / proc.HEAD_ADDRESS_FILE, timeout=30).strip()
    )

    resources = detect_resources(args)
    capacity = (
        args.object_store_memory
        or config.object_store_memory
        or storedirs.default_store_capacity(config.store_base_dir)
    )
    store_dir, file_backed = storedirs.prepare_store_dir(
        session_dir.name,
        node_id.hex(),
        capacity,
        base_dir=config.store_base_dir,
        fallback_dir=str(session_dir / "store"),
    )
    store_lock = storedirs.lock_store_dir(store_dir)  # held until this process ends
    # Free what node managers killed without cleaning up left in shared memory.
    loop.run_in_executor(None, storedirs.sweep_stale_stores, config.store_base_dir)
    spill_dir = config.spill_dir or str(session_dir / "spill" / node_id.hex())
    os.makedirs(spill_dir, exist_ok=True)

    server = make_server(token, max_message_bytes=config.rpc_max_message_bytes)
    port = bind(server, args.host, args.port)
    address = f"{args.host}:{port}"
    prestart = (
        config.worker_prestart if config.worker_prestart is not None else int(resources["CPU"])
    )
    state = NodeState(node_id, address, resources, prestart=prestart)
    channels = Channels(token, config.rpc_max_message_bytes)
    objects = NodeObjects(
        StoreState(capacity, spilling_enabled=config.spilling_enabled),
        store_dir=store_dir,
        spill_dir=spill_dir,
        file_backed=file_backed,
        token=token,
        channels=channels,
        host=args.host,
    )
    service = NodeService(
        state,
        objects,
        channels=channels,
        head_address=head_address,
        session_dir=str(session_dir),
        on_shutdown=stop.set,
    )

    def objects_changed() -> None:
        service.changed.set()
        if service.load_changed is not None:
            service.load_changed.set()

    objects.on_change = objects_changed
    service.workers = WorkerProcesses(
        zygote=zygote,
        node_address=address,
        session_dir=session_dir,
        on_exit=service.worker_exited,
    )
    pb_grpc.add_NodeManagerServicer_to_server(service, server)
    load_reporter = autoscaling.start(service, server, token)
    # runtime_env (issue 17): setup and cache, workers from venvs, logs and listings
    service.agent = make_agent(head_address, token, config.temp_dir)
    service.workers.python_worker_env = {
        "NBCLUSTER_TOKEN_FILE": os.path.abspath(args.token_file),
        "NBCLUSTER_SESSION_DIR": os.path.abspath(args.session_dir),
    }
    jpb_grpc.add_NodeAgentServicer_to_server(
        NodeAgentServicer(service, session_dir / "logs"), server
    )
    transfer_pb2_grpc.add_ObjectTransferServicer_to_server(TransferService(objects), server)
    bundles = BundlesService(service)
    bundles_pb2_grpc.add_BundlesServicer_to_server(bundles, server)
    # The head reserves bundles over a control channel (protocol/ctrl.py) when it can.
    tls_settings = tls.current()
    ctrl = CtrlServer(
        token,
        bundles.ctrl_methods(),
        max_frame=config.rpc_max_message_bytes,
        ssl_context=tls.ssl_context(tls_settings, server=True) if tls_settings else None,
    )
    ctrl_address = ControlAddressService(
        await ctrl.start(args.host) if config.control_channels else ""
    )
    ctrl_pb2_grpc.add_ControlServicer_to_server(ctrl_address, server)
    await server.start()
    service.apply(state.start())  # warm workers start while we register
    objects.refill_pool(initial=True)  # a few reusable files, allocated in the background

    info = pb.NodeInfo(
        node_id=node_id,
        node_name=name,
        address=address,
        hostname=socket.gethostname(),
        store_dir=store_dir,
        total=resources,
        available=resources,
        store_capacity=capacity,
        pid=os.getpid(),
        start_time=time.time(),
    )
    link = HeadLink(
        service,
        token,
        info,
        config.heartbeat_interval_s,
        keepalive=config.node_death_timeout_s / 4,
    )
    service.head_stub = link.stub
    await link.register()
    nodes_dir = session_dir / "nodes"
    nodes_dir.mkdir(exist_ok=True)
    node_file = nodes_dir / f"{node_id.hex()}.json"
    proc.write_atomic(
        node_file,
        json.dumps(
            {
                "node_id": node_id.hex(),
                "address": address,
                "pid": os.getpid(),
                "name": name,
                "store_dir": store_dir,
            }
        ),
    )
    proc.install_signal_handlers(loop, stop.set)
    if args.parent_fd >= 0:
        proc.watch_parent(loop, args.parent_fd, stop.set)
    heartbeat = asyncio.create_task(link.run())
    load_reports = asyncio.create_task(load_reporter.run(head_address))
    monitor = None
    if config.memory_monitor_interval_s > 0:
        monitor = asyncio.create_task(
            memory_monitor(service, config.memory_usage_threshold, config.memory_monitor_interval_s)
        )
    log.info("node %s serving on %s with %s", node_id.hex()[:8], address, resources)
    await stop.wait()
    heartbeat.cancel()
    load_reports.cancel()
    if monitor is not None:
        monitor.cancel()
    await service.workers.stop_all()
    await link.unregister(load_reporter.leave_reason())
    await ctrl.close()
    await server.stop(grace=0.2)
    await objects.close()
    storedirs.remove_store_dir(store_dir)
    os.close(store_lock)
    shutil.rmtree(spill_dir, ignore_errors=True)
    node_file.unlink(missing_ok=True)
    log.info("node stopped")


def main(argv: list[str] | None = None) -> None:
    """Parse arguments and run the node manager until it is stopped."""
    p = argparse.ArgumentParser(prog="nbcluster-node")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--head-address", default="")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--node-id", default="")
    p.add_argument("--node-name", default="")
    p.add_argument("--num-cpus", type=float, default=None)
    p.add_argument("--num-gpus", type=float, default=None)
    p.add_argument("--resources", default="")
    p.add_argument("--object-store-memory", type=int, default=0)
    p.add_argument("--parent-fd", type=int, default=-1)
    p.add_argument("--allow-external", action="store_true")
    args = p.parse_args(argv)
    # Fork the worker fork server before any gRPC object or event loop exists, with what a
    # worker imports already loaded.
    preload_worker_modules()

    death_r, death_w = os.pipe()  # workers see EOF on death_r when this process is gone
    zygote = Zygote(
        {
            "NBCLUSTER_TOKEN_FILE": os.path.abspath(args.token_file),
            "NBCLUSTER_SESSION_DIR": os.path.abspath(args.session_dir),
            "NBCLUSTER_PARENT_FD": str(death_r),
        },
        keep_fds=(death_r,),
    )
    os.close(death_r)
    try:
        asyncio.run(serve(args, zygote, death_w))
    finally:
        os.close(death_w)


if __name__ == "__main__":
    main()

"""`warren serve`: start the shards, listen for AMQP, stop cleanly on a signal.

A broker that cannot start says why on one line of stderr, naming the option
to change, and leaves nothing behind (see serve).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import resource
import shutil
import signal
import socket
import ssl
import sys

import lmdb

from warren.shards import build, logsetup
from warren.shards.malloc import keep_freed_memory
from warren.shards.ring import remove_orphans
from warren.storage import recovery

from ..config import Config
from ..io.process import Gateway
from ..io.protocol import AMQPProtocol
from ..io.tlshandshake import TLSHandshake
from .compaction import Compactor
from .gateways import Followers

log = logging.getLogger("warren")

# Seconds a stopping broker waits for its clients' close-ok: a moment for those that
# answer at once (RabbitMQ 3.10 does not wait: it resets the socket after the 320).
SHUTDOWN_CLOSE_OK_WAIT = 0.1
# Seconds the root waits for its gateways to accept connections before it gives up.
GATEWAYS_START_WAIT = 60.0
LISTEN_BACKLOG = 128  # as RabbitMQ's tcp_listen_options.backlog


class StartupError(Exception):
    """Why the broker cannot start, in one line naming the option that fixes it."""


async def serve(settings: Config) -> None:
    keep_freed_memory()
    raise_descriptor_limit()
    running, failed = build.check()  # which build runs, said once the broker serves
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    # Cheap checks and the listeners come before the stores, rings and shards, and
    # a failure undoes what was done: no shared memory, shard process or new data
    # directory outlives a broker that did not start.
    tls = tls_context(settings) if settings.tls_enabled else None
    data = DataDir(os.path.abspath(settings.data_dir))
    gateway = Gateway(settings)
    # With several gateways this process is the root: it holds the catalogue, the
    # shards and the management API, and hands each client it accepts to one of
    # the gateways it starts.
    many = settings.gateway_count() > 1
    servers = []  # bound, not serving until the broker has started
    held = []  # the root's listening sockets, with several gateways
    try:
        if many:
            held.append(_listening(settings, settings.port, "--port"))
            if tls is not None:
                held.append(_listening(settings, settings.tls_port, "--tls-port"))
            addresses = [sock.getsockname()[:2] for sock in held]
        else:
            servers += await listen(gateway, settings, tls)
            addresses = [server.sockets[0].getsockname()[:2] for server in servers]
        host, port = addresses[0]
        tls_address = addresses[1] if tls is not None else None
        if settings.management_port:  # 0: no management listener
            # Imported here: a gateway process, which uses this module's listener
            # helpers, serves no management API and starts 0.2 s sooner without it.
            from ..management import listener, shapes
            shapes.NODE = settings.node_name or shapes.NODE
            listeners = [{"node": shapes.NODE, "protocol": protocol, "ip_address": address,
                          "port": number} for protocol, address, number in (
                ("amqp", host, port),
                *((("amqp/ssl", *tls_address),) if tls is not None else ()),
                ("http", settings.management_bind, settings.management_port))]
            http = await _bound(listener.start(
                gateway, settings.management_bind, settings.management_port, listeners),
                settings.management_bind, settings.management_port, "--management-port",
                "--management-bind")
            servers.append(http)
        try:
            await gateway.start()
        except recovery.Refused as error:  # damaged stores: the message says what to do
            raise StartupError(str(error)) from None
        except (OSError, lmdb.Error) as error:
            where = f"{error.filename}: " if getattr(error, "filename", None) else ""
            raise StartupError(f"cannot open the stores in {data.path} ({where}"
                               f"{_reason(error)}): repair it or pick another data "
                               f"directory with --data") from None
        if settings.cluster:
            await join_cluster(gateway, settings, f"{host}:{port}", tls,
                               _address(http) if settings.management_port else "")
        if many:
            gateway.followers = Followers(gateway, settings.gateway_count())
            for sock, is_tls in zip(held, (False, True)):
                gateway.followers.listen(sock, is_tls)
            if not await gateway.followers.start(GATEWAYS_START_WAIT):
                await gateway.followers.stop()
                await gateway.stop()
                raise StartupError(f"the gateways did not start within {GATEWAYS_START_WAIT:.0f}"
                                   f" s (see the log); try --gateways 1")
    except BaseException:
        for server in servers + held:
            server.close()
        data.release(remove_created=True)
        raise

    for name in remove_orphans():  # once started: a failed start changes nothing
        log.warning("removed /dev/shm/%s, a ring left behind by a killed broker", name)
    compactor = Compactor(lambda: _broker_pids(gateway)) if settings.load_compaction else None
    if compactor is not None:
        compactor.start()
    for server in servers:
        await server.start_serving()
    if gateway.followers is not None:
        gateway.followers.open()
    # RabbitMQ's lines in the log; the printed ones are for whoever started it.
    log.info("started TCP listener on %s:%d", host, port)
    print(f"Warren listening on amqp://{host}:{port} (data {gateway.data_dir}, "
          f"{settings.shard_count()} shards, {running})", flush=True)
    # In the log too, after the start: a broker that cannot start says only why.
    log.info("running the %s", running)
    if failed:
        log.warning("%s", failed)
    if tls is not None:
        log.info("started TLS (SSL) listener on %s:%d", *tls_address)
        print(f"Warren listening on amqps://{tls_address[0]}:{tls_address[1]}", flush=True)
    if settings.management_port:
        log.info("Management plugin: HTTP (non-TLS) listener started on %s", _address(http))
        print(f"Warren management on http://{_address(http)}", flush=True)

    await stop.wait()
    if compactor is not None:
        compactor.stop()
    if gateway.followers is not None:
        await gateway.followers.stop()  # they close their clients' connections
    await close_connections(gateway, servers)
    if gateway.cluster is not None:
        await gateway.cluster.stop()
    await gateway.stop()
    data.release()
    print("Warren stopped", flush=True)


async def join_cluster(gateway: Gateway, settings: Config, amqp: str,
                       tls: ssl.SSLContext | None, management: str) -> None:
    """Make this node one of the cluster's (cluster/node.py); the link between
    the nodes uses TLS where the AMQP listener does."""
    from ..cluster.node import ClusterError, ClusterNode
    from ..cluster.peers import client_tls
    cluster = ClusterNode(gateway, settings)
    gateway.cluster = cluster
    gateway.catalogue.place = cluster.place
    try:
        await cluster.start(amqp, management, tls, client_tls(settings))
    except ClusterError as error:
        await gateway.stop()
        raise StartupError(str(error)) from None


def raise_descriptor_limit() -> None:
    """Lift the soft limit on open descriptors to the hard one, for this process and
    the shards and gateways it starts, as RabbitMQ's packaging does (LimitNOFILE):
    at the soft 1,024 of many shells, a thousand slow HTTP clients would leave the
    AMQP listener none to accept with."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20  # Linux's nr_open
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as error:
        log.warning("cannot raise the open descriptor limit from %d to %d (%s)", soft, target,
                    _reason(error))
        return
    log.info("raised the open descriptor limit from %d to %d, its hard limit", soft, target)


def _broker_pids(gateway: Gateway) -> list[int]:
    """This process, the shards and the other gateways."""
    pids = [os.getpid(), *gateway.shards.pids()]
    if gateway.followers is not None:
        pids += [process.pid for process in gateway.followers.processes.values()
                 if process.returncode is None]
    return pids


async def close_connections(gateway: Gateway, servers: list) -> None:
    """Stop listening and close every client's connection."""
    log.info("stopping: closing the listeners and %d connections", len(gateway.registry.connections))
    for server in servers:
        server.close()
    # As RabbitMQ: every client is sent 320 CONNECTION_FORCED at once, and the broker
    # does not wait for close-ok beyond a moment for those that answer at once. The
    # 320 is on the wire by then; a connection's work is already released to the shards.
    for conn in list(gateway.registry.connections):
        conn.close_for_shutdown()
    await _wait_for(lambda: not gateway.registry.connections, timeout=SHUTDOWN_CLOSE_OK_WAIT)
    for conn in list(gateway.registry.connections):
        conn.output.abort()
    await asyncio.sleep(0)  # their connection_lost, before the shards stop


async def listen(gateway: Gateway, settings: Config, tls: ssl.SSLContext | None) -> list:
    """The only gateway's AMQP (and AMQPS) listeners, bound, not serving yet."""
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(
        lambda: AMQPProtocol(gateway), sock=_listening(settings, settings.port, "--port"),
        backlog=LISTEN_BACKLOG, start_serving=False)]
    if tls is not None:
        servers.append(await loop.create_server(
            lambda: TLSHandshake(lambda: AMQPProtocol(gateway), tls),
            sock=_listening(settings, settings.tls_port, "--tls-port"),
            backlog=LISTEN_BACKLOG, start_serving=False))
    return servers + await own_listener(gateway, settings)


async def own_listener(gateway: Gateway, settings: Config) -> list:
    """WARREN_GATEWAY_PORTS=1 (a test hook): a listener of this gateway's own on a
    free port, announced on stdout, to pin a client to it."""
    if os.environ.get("WARREN_GATEWAY_PORTS") != "1":
        return []
    own = await asyncio.get_running_loop().create_server(
        lambda: AMQPProtocol(gateway), sock=_listening(settings, 0, "--port"),
        backlog=LISTEN_BACKLOG, start_serving=False)
    # One write: the gateways print at once, and unbuffered (PYTHONUNBUFFERED)
    # print would write the line and its end apart.
    sys.stdout.write(f"Warren gateway {gateway.index} on amqp://{_address(own)}\n")
    sys.stdout.flush()
    return [own]


def _listening(settings: Config, port: int, option: str) -> socket.socket:
    """A socket listening on `port` (a free one for 0) of the bind address. Its
    clients' sockets inherit its receive buffer (tcp_recbuf): fixed, it bounds how
    far a publisher held by flow control gets ahead in the kernel, where Linux's
    autotuning would let each one buffer up to tcp_rmem's maximum (32 MiB on
    many hosts) outside every memory limit (docs/architecture.md)."""
    host = settings.bind
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if settings.tcp_recbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, settings.tcp_recbuf)
    try:
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as error:
        sock.close()
        raise _listen_error(error, host, port, option) from None
    return sock


async def _bound(create, host: str, port: int, port_option: str, bind_option: str = "--bind"):
    """The server `create` makes, or a StartupError saying why it cannot listen."""
    try:
        return await create
    except OSError as error:
        raise _listen_error(error, host, port, port_option, bind_option) from None


def _listen_error(error: OSError, host: str, port: int, port_option: str,
                  bind_option: str = "--bind") -> StartupError:
    if error.errno == errno.EADDRINUSE:
        hint = f"another broker is running there; pick another port with {port_option}"
    elif error.errno == errno.EACCES:
        hint = f"ports below 1024 need privileges; pick another port with {port_option}"
    else:
        hint = f"pick another address with {bind_option} or port with {port_option}"
    return StartupError(f"cannot listen on {host}:{port} ({_reason(error)}): {hint}")


def _address(server) -> str:
    host, port = server.sockets[0].getsockname()[:2]
    return f"{host}:{port}"


def _reason(error: Exception) -> str:
    """An error's plain text, without errno numbers or file names: 'address already in use'."""
    errno_ = getattr(error, "errno", None)
    text = os.strerror(errno_) if isinstance(errno_, int) and errno_ > 0 else (
        getattr(error, "strerror", None) or str(error))
    return text[:1].lower() + text[1:]


class DataDir:
    """The data directory, created if missing and locked (flock on DATA/.lock, which
    holds the owner's pid) for the broker's life, so that two brokers never share
    the stores."""

    def __init__(self, path: str):
        self.path = path
        # The topmost directory this creates, to remove again if startup fails.
        self._created = None
        missing = path
        while not os.path.exists(missing):
            self._created, missing = missing, os.path.dirname(missing)
        if not os.path.isdir(missing):
            raise StartupError(f"cannot use data directory {path} (not a directory): "
                               f"pick another with --data")
        try:
            os.makedirs(path, exist_ok=True)
            self._fd = os.open(os.path.join(path, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            self._remove_created()
            raise StartupError(f"cannot use data directory {path} ({_reason(error)}): "
                               f"pick another with --data") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(self._fd, 32).decode(errors="replace").strip()
            os.close(self._fd)
            pid = f" (pid {owner})" if owner else ""  # empty while the owner starts up
            raise StartupError(f"data directory {path} is in use by another Warren{pid}; "
                               f"stop it or use --data") from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self, remove_created: bool = False) -> None:
        os.close(self._fd)
        if remove_created:
            self._remove_created()

    def _remove_created(self) -> None:
        if self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)


def tls_context(settings: Config) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # The files exist (config.check); say which one OpenSSL cannot use.
    try:
        ssl.create_default_context().load_verify_locations(settings.tls_certfile)
    except OSError as error:  # ssl.SSLError included
        raise StartupError(f"cannot use TLS certificate {settings.tls_certfile} "
                           f"({_ssl_reason(error)}): give a PEM certificate with "
                           f"--tls-certfile") from None
    def encrypted_key():  # instead of OpenSSL prompting for a passphrase
        raise StartupError(f"cannot use TLS key {settings.tls_keyfile} (it is encrypted): "
                           f"give an unencrypted PEM private key with --tls-keyfile")

    try:
        context.load_cert_chain(settings.tls_certfile, settings.tls_keyfile, encrypted_key)
    except OSError as error:
        raise StartupError(f"cannot use TLS key {settings.tls_keyfile} ({_ssl_reason(error)}): "
                           f"give the certificate's PEM private key with --tls-keyfile") from None
    if settings.tls_cafile:
        try:
            context.load_verify_locations(settings.tls_cafile)
        except OSError as error:
            raise StartupError(f"cannot use TLS CA bundle {settings.tls_cafile} "
                               f"({_ssl_reason(error)}): give PEM CA certificates with "
                               f"--tls-cafile") from None
    context.verify_mode = ssl.CERT_REQUIRED if settings.tls_verify_peer else ssl.CERT_NONE
    return context


def _ssl_reason(error: Exception) -> str:
    """OpenSSL's words without its codes: '[X509: X] key values mismatch (_ssl.c:1)'."""
    if not isinstance(error, ssl.SSLError):
        return _reason(error)
    text = (error.strerror or str(error)).split("] ", 1)[-1].split(" (_ssl.c:")[0]
    return "not valid PEM" if text == "PEM lib" else text


async def _wait_for(condition, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition() and loop.time() < deadline:
        await asyncio.sleep(0.02)


def run(settings: Config) -> int:
    """Serve until a signal; the exit code (1: could not start, said on one line)."""
    try:
        logsetup.configure(settings.log_settings(), "gateway")
    except OSError as error:
        print(f"warren: cannot open log file {settings.log_file} ({_reason(error)}): "
              f"pick another with --log-file", file=sys.stderr)
        return 1
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(serve(settings))
    except StartupError as error:
        print(f"warren: {error}", file=sys.stderr)
        return 1
    return 0

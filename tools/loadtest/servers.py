"""The load test's servers: presence's Redis (or a three-master cluster), two channel-layer
Redis servers, and N daphne processes, each a child stopped by its pid (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tools.processes import answers_http, stop_process
from tools.redis_cluster import RedisCluster
from tools.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
DAPHNE = Path(sys.executable).parent / "daphne"
START_TIMEOUT = 60.0
#: seconds a WebSocket handshake may take before daphne drops it (its default is 5)
HANDSHAKE_TIMEOUT = 30
#: the demo site, as the load test serves it
SITE = "siteproject.asgi:application"
#: the floor of a reconnect storm (--storm): a bare Channels consumer behind
#: AuthMiddlewareStack at ws/bare/ (the page-view benchmark's server application)
BARE = "benchmarks.page_views_asgi:application"


class DaphneProcess:
    """``daphne -b 127.0.0.1 -p PORT siteproject.asgi:application`` (or ``app``) on the load
    test's settings; its stdout and stderr go to ``log_path`` (appended to across restarts)."""

    def __init__(
        self,
        index: int,
        env: dict[str, str],
        log_dir: Path,
        app: str = SITE,
        name: str = "",
        census: bool = True,
    ) -> None:
        self.index = index
        self.app = app
        self.port = free_port()
        self.env = env
        self.log_path = log_dir / f"daphne-{name or index}.log"
        self.process: subprocess.Popen[bytes] | None = None
        #: whether its first start takes the memory census (tools.loadtest.memory)
        self.census = census
        self.starts = 0

    def start_env(self) -> dict[str, str]:
        """The environment of the next start. Only a process's first start takes the memory
        census, which the memory rows read of processes never restarted alone: a census
        sample walks glibc's arenas holding their locks (about a second on a storm's
        restarted server, stalling its event loop's allocations), inside the storm's timed
        window, which the floors' bare servers did not pay alike."""
        if self.census and self.starts == 0:
            return self.env
        return {key: value for key, value in self.env.items() if key != "LOADTEST_MEMORY_DIR"}

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/presence/"

    def start(self) -> None:
        env = self.start_env()
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(DAPHNE),
                    "-v",
                    "0",
                    "-b",
                    "127.0.0.1",
                    "-p",
                    str(self.port),
                    # As docs/deployment.md advises: a handshake queued behind a reconnect storm
                    # completes instead of being dropped after daphne's default 5 s (the
                    # middleware's work done in vain, the client back after a backoff).
                    "--websocket_connect_timeout",
                    str(HANDSHAKE_TIMEOUT),
                    self.app,
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"daphne {self.index} exited; see {self.log_path}")
            if answers_http(self.port):
                return
            time.sleep(0.2)
        raise RuntimeError(f"daphne {self.index} did not answer on port {self.port}")

    def stop(self) -> None:
        stop_process(self.process, timeout=15)
        self.process = None

    def kill(self) -> None:
        """A crash: SIGKILL, nothing runs on the way out."""
        stop_process(self.process, timeout=15, kill=True)
        self.process = None


class Servers:
    """Everything the servers need, started in order and stopped in reverse, also on failure."""

    def __init__(self, processes: int, cluster: bool, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.cluster: RedisCluster | None = RedisCluster() if cluster else None
        self.redis: RedisServer | None = None if cluster else RedisServer()
        self.layer = [RedisServer(), RedisServer()]
        self.count = processes
        self.daphnes: list[DaphneProcess] = []

    @property
    def redis_url(self) -> str:
        return self.redis.url if self.redis else ""

    def env(self, database: str, presence_json: str) -> dict[str, str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tools.loadtest.settings",
            "LOADTEST_DATABASE": database,
            "LOADTEST_PRESENCE": presence_json,
            "LOADTEST_APPLICATION": "loadtest-daphne",
            "LOADTEST_LAYER_HOSTS": ",".join(server.url for server in self.layer),
            "LOADTEST_MEMORY_DIR": str(self.log_dir),
            # As docs/deployment.md advises (a malloc arena per thread held freed memory:
            # RSS crept on under repeated faults); --server-env MALLOC_ARENA_MAX=8 to compare.
            "MALLOC_ARENA_MAX": "2",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        if self.cluster:
            env["LOADTEST_CLUSTER_URLS"] = ",".join(self.cluster.urls)
            # The cache (sessions are cookies; nothing else uses it) on a layer server.
            env["LOADTEST_REDIS_URL"] = self.layer[0].url
        else:
            assert self.redis is not None
            env["LOADTEST_REDIS_URL"] = self.redis.url
        return env

    def start_redis(self) -> None:
        if self.cluster:
            self.cluster.start()
        elif self.redis:
            self.redis.start()
        for server in self.layer:
            server.start()

    def plan_daphnes(self, env: dict[str, str]) -> None:
        """The daphne processes with their ports, not started yet: the clients are planned
        first, and ``env`` (shared, not copied) may still change before they start."""
        self.daphnes = [DaphneProcess(i, env, self.log_dir) for i in range(self.count)]

    def start_daphnes(self, env: dict[str, str]) -> None:
        if not self.daphnes:
            self.plan_daphnes(env)
        for daphne in self.daphnes:
            daphne.start()
        for daphne in self.daphnes:
            daphne.wait_ready()

    def stop(self) -> None:
        for daphne in self.daphnes:
            daphne.stop()
        for server in self.layer:
            server.__exit__()
        if self.redis:
            self.redis.__exit__()
        if self.cluster:
            self.cluster.stop()

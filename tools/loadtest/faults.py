"""Faults injected during the load (``--faults``), each with a window and a measured convergence.

A fault's window runs from its start until it ends plus the convergence bound
(``config.CONVERGENCE_BOUND``); closes, 5xx answers and log errors inside it are expected and
counted apart. After each fault the harness pauses the behaviours and compares views with the
oracle every 0.5 s until all agree: that time, from the fault's end, is its convergence.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Protocol

import redis

from tools.loadtest import calibrate, config
from tools.loadtest.config import Sizes
from tools.loadtest.harness import Generators, Oracle, RelationChanges
from tools.loadtest.servers import Servers
from tools.loadtest.windows import Window


class LoadRun(Protocol):
    """What the faults use of the run (``tools.loadtest.run.Run``), named here so that this
    module does not import the one that drives it."""

    args: argparse.Namespace
    #: the servers' environment (the storm's bare floor starts a daphne of its own on it)
    env: dict[str, str]
    sizes: Sizes
    servers: Servers
    windows: list[Window]
    generators: Generators
    relations: RelationChanges
    oracle: Oracle

    def pause_behaviours(self) -> None:
        """Pause the clients' behaviours and the relation changes (their time not counted as
        the load's: tools/loadtest/clock.py)."""

    def resume_behaviours(self) -> None: ...


class Faults:
    def __init__(self, run: LoadRun) -> None:
        self.run = run
        self.restarted: set[int] = set()
        #: channel-layer client prefixes of killed processes: their hub's group memberships
        #: stay until channels_redis's group_expiry (nobody is left to discard them)
        self.killed_prefixes: set[str] = set()

    def names(self) -> list[str]:
        names = ["kill a daphne", "restart Redis", "CLIENT PAUSE 2 s"]
        names.append("terminate PostgreSQL connections")
        names.append("stop a channel-layer shard")
        chosen = self.run.args.fault
        return [n for n in names if not chosen or any(word in n for word in chosen)]

    def inject(self, name: str) -> None:
        window = Window(name, time.time())
        self.run.windows.append(window)
        print(f"loadtest: fault: {name} at {window.start:.1f}", flush=True)
        if name == "kill a daphne":
            self.kill_daphne()
        elif name == "restart Redis":
            self.restart_redis()
        elif name == "CLIENT PAUSE 2 s":
            self.client_pause()
        elif name == "terminate PostgreSQL connections":
            if not self.run.args.database:
                window.note = " (skipped: SQLite; give --database for PostgreSQL)"
                window.end = time.time()
                window.converged_in = 0.0
                print("loadtest: fault skipped: pg_terminate_backend needs PostgreSQL", flush=True)
                return
            self.terminate_postgres()
        elif name == "stop a channel-layer shard":
            self.stop_layer_shard()
        window.end = time.time()
        print(f"loadtest: fault: {name} over after {window.end - window.start:.1f} s", flush=True)
        self.converge(window)

    def converge(self, window: Window) -> None:
        run = self.run
        run.pause_behaviours()
        try:
            check = run.oracle.check(run.sizes.checkpoint_sample, bound=config.CONVERGENCE_BOUND)
        finally:
            run.resume_behaviours()
        if check.wrong == 0:
            window.converged_in = time.time() - window.end
        window.wrong_after = check.wrong
        state = (
            f"converged {window.converged_in:.1f} s after its end"
            if window.converged_in is not None
            else f"{check.wrong} views still wrong after {config.CONVERGENCE_BOUND} s"
        )
        print(f"loadtest: fault: {window.name}: {state} ({check.views} views)", flush=True)
        if check.wrong:
            for example in check.examples[:3]:
                print(f"loadtest:   wrong: {example}", flush=True)
                print(f"loadtest:   its target's connections: {self.connections_of(example[1])}")
                print(f"loadtest:   its target's group: {self.group_of(example[1])}", flush=True)
            print(f"loadtest:   the hubs listen on: {self.hub_channels()}", flush=True)
            print(f"loadtest:   {check.diagnosis}", flush=True)
        if check.still_wrong:
            # Counted; then those pages reload, so that the next fault starts from true views.
            run.oracle.reload(check.still_wrong)
            time.sleep(2.0)

    @staticmethod
    def connections_of(user_id: int) -> object:
        """The user's connections as the store holds them now (for a diagnosis)."""
        from presence.store import get_store

        store = get_store()
        try:
            return store.run(store.plans.describe_connections(user_id))
        except Exception as error:
            return repr(error)

    def group_of(self, user_id: int) -> object:
        """The channels in the user's channel-layer group, on every layer server (diagnosis)."""
        from presence.announce import group_name

        key = f"asgi:group:{group_name(user_id)}"
        found = {}
        for server in self.run.servers.layer:
            try:
                client = redis.Redis.from_url(server.url, socket_timeout=2)
                members = client.zrange(key, 0, -1)
                client.close()
            except Exception as error:
                members = [repr(error)]
            if members:
                found[server.url] = [m.decode() if isinstance(m, bytes) else m for m in members]
        return found

    def hub_channels(self) -> list[str]:
        """Each daphne's hub channel, as it last logged it (diagnosis)."""
        channels = []
        for daphne in self.run.servers.daphnes:
            logged = re.findall(
                r"listens on channel (\S+)\.", daphne.log_path.read_text(errors="replace")
            )
            channels.append(logged[-1] if logged else "?")
        return channels

    def kill_daphne(self) -> None:
        """SIGKILL one server process and start it again on the same port; its clients
        reconnect by themselves."""
        daphne = self.run.servers.daphnes[0]
        # The process its hub listened for, as it logged its channel ("specific.<process>...").
        logged = daphne.log_path.read_text(errors="replace")
        self.killed_prefixes |= calibrate.channels_of(logged)
        daphne.kill()
        time.sleep(1.0)
        daphne.start()
        daphne.wait_ready()
        self.restarted.add(daphne.index)

    def restart_redis(self) -> None:
        """presence's Redis (with --cluster: one master) stopped and started, empty."""
        servers = self.run.servers
        if servers.cluster:
            node = servers.cluster.nodes[0]
            node.stop()
            time.sleep(1.0)
            node.start()
            servers.cluster.wait_ok(30)
        else:
            assert servers.redis is not None
            servers.redis.stop()
            time.sleep(1.0)
            servers.redis.start()

    def client_pause(self) -> None:
        servers = self.run.servers
        port = servers.cluster.nodes[0].port if servers.cluster else servers.redis.port  # type: ignore[union-attr]
        client = redis.Redis(port=port)
        client.execute_command("CLIENT", "PAUSE", 2000)
        client.close()
        time.sleep(2.0)

    def terminate_postgres(self) -> None:
        """Every database connection of the servers (application_name loadtest-daphne) ended
        by PostgreSQL, as a failover or an idle-session killer would."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'loadtest-daphne' AND pid <> pg_backend_pid()"
            )
            (ended,) = cursor.fetchone()
        print(f"loadtest: fault: {ended} server connections terminated", flush=True)

    def stop_layer_shard(self) -> None:
        """One of the channel layer's two Redis servers stopped for 3 s and started, empty."""
        shard = self.run.servers.layer[1]
        shard.stop()
        time.sleep(3.0)
        shard.start()

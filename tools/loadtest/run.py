"""One run of the load test, from seeding to the final line (``python -m tools.loadtest``)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import re
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import django

from tools.loadtest import calibrate, config, report, rooms, signals
from tools.loadtest.calibrate import Bare
from tools.loadtest.clock import Running, Tally
from tools.loadtest.config import Sizes
from tools.loadtest.faults import Faults
from tools.loadtest.generator import ClientSpec, GeneratorSpec, Stats
from tools.loadtest.generator import main as generator_main
from tools.loadtest.lags import HubLags
from tools.loadtest.servers import Servers
from tools.loadtest.windows import Window
from tools.redis_server import scan_keys

#: hidden users (every visibility "nobody", never changed) and how many pages show each
HIDDEN_USERS = 50
DEVICES = ("web", "web", "web", "mobile", "desktop")
LOG_RECORD = re.compile(r"^(\d{9,}\.\d{3}) (\w+) (\S+) (.*)$")


def mix_scale(rate: float, sizes: config.Sizes) -> float:
    """The share of the plan's rates the rest of the mix runs at: the page views' (the pace
    chose ``rate`` of the plan's ``churn_per_second`` per connection), never above the plan."""
    planned = sizes.churn_per_second * sizes.connections
    return 1.0 if planned <= 0 else min(1.0, rate / planned)


@dataclass
class LogScan:
    errors: list[str] = field(default_factory=list)
    excused: int = 0
    warnings: int = 0


#: a soak with --faults repeats them, one fault every this many seconds at least
FAULT_EVERY = 20.0


class Run:
    def __init__(
        self,
        args: argparse.Namespace,
        sizes: Sizes,
        servers: Servers,
        env: dict[str, str],
        work: Path,
    ) -> None:
        self.args = args
        self.sizes = sizes
        self.servers = servers
        self.env = env
        self.work = work
        self.faults: Faults | None = None
        self.steady_from = 0.0
        self.steady_after = 0.0
        self.rows: list[tuple[str, str]] = []
        self.windows: list[Window] = []
        self.rng = random.Random(3)
        self.processes: list[Any] = []
        self.restarted: set[int] = set()
        self.warmed_up_at = 0.0
        from tools.loadtest.cpu import CpuMeter

        self.cpu = CpuMeter(self.process_groups)
        self.load_ended_at = 0.0
        #: views not right after the reconnect storm (--storm)
        self.storm_wrong = 0
        #: what bare Channels costs here (--rate; tools/loadtest/calibrate.py), if measured
        self.bare: Bare | None = None
        self.signal_check = signals.SignalCheck()
        #: room views still wrong at a checkpoint or the final check, and members the oracle
        #: listed to a viewer who may never see them (rooms.py)
        self.rooms_wrong = 0
        self.rooms_leaked = 0
        self.rooms_row = ""
        #: page views over sockets per second across all connections (the pace's)
        self.planned_rate = 0.0
        #: the page views' rate is "auto" (the machine's, calibrate.py), not --rate's
        self.auto_rate = False
        #: the share of the plan the rest of the mix runs at (mix_scale)
        self.mix_scale = 1.0
        #: the load's own time (behaviours running) and what the servers did meanwhile
        self.running = Running()
        self.server_cpu = Tally()
        self.page_views = Tally()

    # --- set-up -------------------------------------------------------------------------------

    def setup_database(self) -> None:
        django.setup()
        from django.core.management import call_command

        from tools.loadtest import population

        started = time.monotonic()
        call_command("migrate", verbosity=0)
        migrated = time.monotonic() - started
        sizes = self.sizes
        graph = population.build_graph(
            sizes.users, sizes.median_contacts, sizes.max_contacts, sizes.hubs, HIDDEN_USERS
        )
        built = time.monotonic() - started - migrated
        seeded = population.seed(graph)
        self.graph, self.pks = graph, seeded.pks
        degrees = sorted(len(c) for c in graph.contacts)
        print(
            f"loadtest: seeded {sizes.users} users, {graph.rows} contacts (median "
            f"{population.median_degree(graph):.0f}, max {degrees[-1]}), "
            f"{len(graph.blocks)} blocks in {seeded.seconds:.1f} s "
            f"(graph built in {built:.1f} s, migrations {migrated:.1f} s)",
            flush=True,
        )
        self.rows.append(
            ("seeding (not measured)", f"{seeded.seconds + built:.1f} s, {graph.rows:,} contacts")
        )

    def plan_clients(self) -> list[GeneratorSpec]:
        from django.contrib.auth import get_user_model

        from tools.loadtest.population import session_cookie

        sizes, graph, pks, rng = self.sizes, self.graph, self.pks, self.rng
        hidden = [pks[i] for i in graph.hidden]
        blocked = {(pks[a], pks[b]) for a, b in graph.blocked_pairs()}
        # Connected users: the hidden ones and those in seeded blocks first (so that leaks have
        # something to leak), then random ones; a tenth of the connections are second tabs.
        block_users = sorted({u for pair in graph.blocks for u in pair})
        others = [
            u for u in rng.sample(range(graph.users), graph.users) if u not in set(graph.hidden)
        ]
        distinct = min(graph.users, max(1, int(sizes.connections * 0.9)))
        chosen = list(dict.fromkeys([*graph.hidden, *block_users[: distinct // 4], *others]))[
            :distinct
        ]
        owners = chosen + [rng.choice(chosen) for _ in range(sizes.connections - len(chosen))]
        users = get_user_model().objects.in_bulk([pks[i] for i in set(owners)])
        cookies = {pk: session_cookie(user) for pk, user in users.items()}
        blocked_of: dict[int, list[int]] = {}
        for a, b in graph.blocked_pairs():
            blocked_of.setdefault(a, []).append(b)
        self.pages: dict[int, list[int]] = {}
        specs: list[ClientSpec] = []
        for index, owner in enumerate(owners):
            user = pks[owner]
            if user not in self.pages:
                contacts = sorted(graph.contacts[owner])
                page = rng.sample(contacts, min(len(contacts), sizes.page * 3 // 4))
                page += rng.sample(range(graph.users), 8)
                page += rng.sample(graph.hidden, 2) + blocked_of.get(owner, [])[:3]
                ids = list(dict.fromkeys(pks[i] for i in page if i != owner))[: sizes.page + 5]
                self.pages[user] = ids
            specs.append(
                ClientSpec(
                    index=index,
                    user=user,
                    cookie=cookies[user],
                    page=self.pages[user],
                    device=rng.choice(DEVICES),
                    server=index % sizes.processes,
                    rooms=rooms.assign(index),
                )
            )
        # Page viewers without a socket: online through the middleware for ONLINE_WINDOW.
        viewers_pool = [u for u in others[distinct : distinct + max(10, sizes.users // 40)]]
        viewer_users = get_user_model().objects.in_bulk([pks[i] for i in viewers_pool])
        page_viewers = [(pk, session_cookie(u)) for pk, u in viewer_users.items()]
        self.hidden, self.blocked = set(hidden), blocked
        ports = [d.port for d in self.servers.daphnes]
        gens = []
        for number in range(sizes.generators):
            mine = specs[number :: sizes.generators]
            gens.append(
                GeneratorSpec(
                    number=number,
                    clients=mine,
                    page_viewers=page_viewers[number :: sizes.generators],
                    ports=ports,
                    hidden=set(hidden),
                    blocked_pairs=blocked,
                    heartbeat_interval=config.HEARTBEAT_INTERVAL,
                    churn_per_second=sizes.churn_per_second,
                    status_per_second=sizes.status_per_second,
                    idle_per_second=sizes.idle_per_second,
                    page_views_per_second=sizes.page_views_per_second,
                    seed=100 + number,
                )
            )
        self.positions = {
            spec.index: (number, position)
            for number, gen in enumerate(gens)
            for position, spec in enumerate(gen.clients)
        }
        return gens

    def start_generators(self, specs: list[GeneratorSpec]) -> list[Connection]:
        context = multiprocessing.get_context("spawn")
        pipes = []
        for spec in specs:
            ours, theirs = context.Pipe()
            process = context.Process(target=generator_main, args=(spec, theirs), daemon=True)
            process.start()
            self.processes.append(process)
            pipes.append(ours)
        return pipes

    def stop_generators(self) -> None:
        for process in self.processes:
            process.join(timeout=20)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()

    # --- the run ------------------------------------------------------------------------------

    def execute(self) -> int:
        try:
            return self._execute()
        finally:
            self.stop_generators()

    def _execute(self) -> int:
        from tools.loadtest.harness import Generators, Oracle, RelationChanges

        started_all = time.monotonic()
        self.setup_database()
        self.servers.plan_daphnes(self.env)
        specs = self.plan_clients()
        pipes = self.start_generators(specs)
        generators = Generators(pipes)
        self.generators = generators
        # Before the servers start: their timing follows the pace chosen (calibrate.py).
        pace = self.pace()
        started = time.monotonic()
        self.servers.start_daphnes(self.env)
        print(
            f"loadtest: {self.sizes.processes} daphne processes up in "
            f"{time.monotonic() - started:.1f} s "
            f"(pids {', '.join(str(d.pid) for d in self.servers.daphnes)})",
            flush=True,
        )
        per_generator = pace.opening / len(pipes) if pace.opening else None
        for pipe in pipes:
            pipe.send(("open", (config.HEARTBEAT_INTERVAL, per_generator)))
        opening_seconds = self.sizes.connections / pace.opening if pace.opening else 0.0
        opened, settled, slowest, last = self.wait_opened(
            pipes, 300 + opening_seconds / calibrate.MIN_PACE, pace.opening_cores
        )
        if slowest < 1.0:
            text = (
                f"its pace cut to {slowest:.0%} of the plan at the slowest: the servers' CPU "
                f"kept within {pace.opening_cores:.2f} cores"
            )
            print(f"loadtest: paced opening: {text}", flush=True)
            self.rows.append(("paced opening", text))
        print(
            f"loadtest: {self.sizes.connections} connections opened in {max(opened):.1f} s, "
            f"every snapshot in {max(settled):.1f} s later",
            flush=True,
        )
        self.rows.append(
            (
                "connections opened in",
                f"{max(opened):.1f} s; every snapshot in {max(settled):.1f} s later "
                "(the load starts then)",
            )
        )
        self.oracle = Oracle(generators, self.pages, self.positions, self.hidden, self.blocked)
        rate = pace.rate
        if self.auto_rate and last < 1.0:
            # The opening measured what a socket's opening costs at this size (each announced
            # to the watchers among every socket open, which the calibration's 500 do not
            # show): a page view is a close and an opening at this size, so it follows.
            rate = pace.rate * last
            text = (
                f"page views {rate:.1f}/s: the plan's {pace.rate:.1f} at the opening's last pace "
                f"({last:.0%}: an opening at this size cost {1 / last:.1f} x the calibration's)"
            )
            print(f"loadtest: pace: {text}", flush=True)
            self.rows.append(("page views at this size", text))
        self.planned_rate = rate
        # The whole mix at the pace the machine carries: status changes, idle switches, HTTP
        # page views and relation changes each announce to watchers too (fan-out the
        # calibration does not measure), so they follow the page views' share of the plan.
        self.mix_scale = mix_scale(rate, self.sizes)
        self.generators.ask("rate", (rate / max(1, self.sizes.connections), self.mix_scale))
        if self.mix_scale < 1:
            text = (
                f"status changes, idle switches, HTTP page views and relation changes at "
                f"{self.mix_scale:.0%} of the plan, as the page views"
            )
            print(f"loadtest: pace: {text}", flush=True)
            self.rows.append(("the rest of the mix", text))
        below = pace.caught_up_below(self.sizes.processes)
        if below is not None:
            waited, cores, late = calibrate.wait_caught_up(
                [(d.pid, d.log_path) for d in self.servers.daphnes],
                below,
                calibrate.CAUGHT_UP_TIMEOUT,
            )
            text = (
                f"{waited:.0f} s after the snapshots (servers {cores:.2f} cores over the last "
                f"{calibrate.CAUGHT_UP_WINDOW:.0f} s, the heartbeats' {below:.2f} or less wanted; "
                f"{late} behind their channel)"
            )
            print(f"loadtest: the servers done with the opening {text}", flush=True)
            self.rows.append(("servers done with the opening", text))
        relations = RelationChanges(
            self.graph, self.pks, self.sizes.relations_per_second * self.mix_scale
        )
        relations.start()
        self.relations = relations
        stats_before = self.totals(generators.stats())
        load_started = time.time()
        self.cpu.start()
        self.hub_lags = HubLags([daphne.port for daphne in self.servers.daphnes])
        self.hub_lags.start()
        # A paced opening's behaviours waited for this (the servers done with the opening).
        self.resume_behaviours()
        # Changes made once the opening storm has passed (the servers record and announce
        # every connection for a few seconds after the clients have opened them).
        self.steady_after = min(10.0, self.sizes.seconds / 3)
        checks = []
        rss_start: list[int] | None = None
        #: (seconds into the load, what was just done, RSS of each process): the shape of any
        #: growth (a leak climbs on; a burst's high-water mark stays flat after it)
        self.rss_timeline: list[tuple[float, str, list[int]]] = []
        try:
            faults = Faults(self) if self.args.faults or self.args.storm else None
            self.faults = faults
            self.restarted = faults.restarted if faults else set()
            schedule = self.checkpoint_times(faults if self.args.faults else None)
            if self.args.storm:
                schedule = sorted([*schedule, (min(8.0, self.sizes.seconds / 3), "storm")])
            # The schedule and --seconds count the load's own time: the checks' pauses do not
            # eat it (tools/loadtest/clock.py).
            for at, action in schedule:
                wait = at - self.running.seconds(time.time())
                if wait > 0:
                    time.sleep(wait)
                if action == "checkpoint":
                    checks.append(self.checkpoint(sample=self.sizes.checkpoint_sample))
                elif action == "warmed up":
                    rss_start = self.rss()
                    self.warmed_up_at = time.time()
                elif action == "storm" and faults is not None:
                    self.reconnect_storm(faults)
                elif faults is not None:
                    faults.inject(action)
                self.rss_timeline.append((time.time() - load_started, action, self.rss()))
                self.cpu.sample()
            remaining = self.sizes.seconds - self.running.seconds(time.time())
            if remaining > 0:
                time.sleep(remaining)
            # The load ends: the behaviours stay paused through the final check.
            self.pause_behaviours()
            ended = time.time()
            load_seconds = self.running.seconds(ended)
            wall_seconds = ended - load_started
            stats_during = self.totals(generators.stats())
            print(f"loadtest: clients at the end of the load: {stats_during.states}", flush=True)
            rss_end = self.rss()
            self.cpu.sample()
            self.load_ended_at = time.time()
            final = self.checkpoint(sample=None, final=True)
            if rooms.SHARE:
                room_check = self.check_rooms("final")
                joined = sum(1 for index in range(self.sizes.connections) if rooms.assign(index))
                self.rooms_row = rooms.row(room_check, joined, self.sizes.connections)
            beats_lost, beats_checked = self.lost_heartbeats()
        finally:
            relations.stop()
            self.hub_lags.stop()
        stats = self.totals(generators.stats("stop"))
        orphans = self.orphans()
        # Every client has left and every timeout passed: each user's signals end offline. A
        # restart of presence's Redis (empty) explains only its own patterns, around its window.
        restarts = [
            (window.start, window.end or window.start)
            for window in self.windows
            if window.name == "restart Redis"
        ]
        self.signal_check = signals.check(
            self.work / "signals", restarts, slack=config.CONVERGENCE_BOUND
        )
        print(signals.report(self.signal_check), flush=True)
        return self.summarize(
            stats,
            stats_before,
            stats_during,
            load_seconds,
            wall_seconds,
            checks,
            final,
            beats_lost,
            beats_checked,
            rss_start,
            rss_end,
            orphans,
            time.monotonic() - started_all,
        )

    def pace(self) -> calibrate.Plan:
        """The pace of the mix (tools/loadtest/calibrate.py): measured here first unless
        ``--quick`` without ``--rate``; ``--heartbeat`` and ``--rate`` given are kept. The
        heartbeat chosen is set in the servers' and the harness's settings before they use it."""
        args, sizes = self.args, self.sizes
        rate_arg = args.rate or (None if args.quick else "auto")
        self.auto_rate = rate_arg == "auto"
        default_rate = sizes.churn_per_second * sizes.connections
        if rate_arg is None:
            return calibrate.Plan(config.HEARTBEAT_INTERVAL, default_rate, None)
        import psutil

        free = calibrate.available_cores()
        load = ", ".join(f"{value:.2f}" for value in psutil.getloadavg())
        print(
            f"loadtest: the machine: {psutil.cpu_count()} cores, {free:.1f} free before the "
            f"run (load average {load})",
            flush=True,
        )
        if free < (psutil.cpu_count() or 1) / 2:
            print(
                "loadtest: most of the machine is busy with other work: the pace is that "
                "little's, and the run measures the machine as much as presence",
                flush=True,
            )
        bare, ours = calibrate.measure(
            self.generators, self.positions, sizes.processes, self.env, self.servers.log_dir
        )
        self.bare = bare
        calibrate.forget_memberships([server.url for server in self.servers.layer], ours.channels)
        print(f"loadtest: bare Channels here: {bare.row()}", flush=True)
        print(f"loadtest: ours here: {ours.row()}", flush=True)
        self.rows.append(("bare Channels here", bare.row()))
        self.rows.append(("ours here (calibration)", ours.row()))
        plan = calibrate.plan(
            bare,
            ours,
            sizes.connections,
            config.HEARTBEAT_INTERVAL,
            default_rate,
            heartbeat=args.heartbeat,
            rate=None if rate_arg == "auto" else float(rate_arg),
            cores=free,
        )
        if plan.heartbeat != config.HEARTBEAT_INTERVAL:
            self.set_heartbeat(plan.heartbeat)
        for_each = plan.rate / max(1, sizes.connections)
        plan.why[0] += f" (each connection's page reloaded or closed every {1 / for_each:.0f} s)"
        for line in plan.why:
            print(f"loadtest: pace: {line}", flush=True)
        self.rows.append(
            ("pace (calibrate.py)", f"{free:.1f} cores free (load {load}): " + "; ".join(plan.why))
        )
        return plan

    def wait_opened(
        self, pipes: list[Any], timeout: float, budget: float | None
    ) -> tuple[list[float], list[float], float, float]:
        """Each generator's opening and settling times, once all are done; meanwhile, for a
        paced opening (``budget``: the servers' cores it may use), the pace follows the servers'
        CPU (calibrate.next_pace). Returns those times, the slowest pace set and the last."""
        from tools.loadtest.storm import cpu_seconds

        deadline = time.monotonic() + timeout
        done: dict[int, tuple[float, float]] = {}
        servers = [(d.pid, d.log_path) for d in self.servers.daphnes]
        before = sum(cpu_seconds(pid) for pid, _ in servers)
        factor = slowest = 1.0
        while len(done) < len(pipes):
            window = time.monotonic()
            for number, pipe in enumerate(pipes):
                if number not in done and pipe.poll(0):
                    done[number] = pipe.recv()[1]
            if len(done) == len(pipes):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the generators did not open their connections in time")
            time.sleep(calibrate.PACE_WINDOW)
            if budget is None:
                continue
            now = sum(cpu_seconds(pid) for pid, _ in servers)
            cores = (now - before) / max(time.monotonic() - window, 0.1)
            before = now
            late = any(calibrate.behind(log) for _, log in servers)
            paced = calibrate.next_pace(factor, cores, budget, late)
            if paced != factor:
                factor, slowest = paced, min(slowest, paced)
                for number, pipe in enumerate(pipes):
                    if number not in done:
                        pipe.send(("pace", factor))
        times = [done[number] for number in range(len(pipes))]
        return [t[0] for t in times], [t[1] for t in times], slowest, factor

    def set_heartbeat(self, seconds: int) -> None:
        """The heartbeat chosen, in the servers' settings (not started yet) and the harness's."""
        from django.conf import settings
        from django.core.signals import setting_changed

        config.set_heartbeat(seconds)
        timing = config.presence_settings()
        self.env["LOADTEST_PRESENCE"] = json.dumps(timing)
        presence = {**settings.PRESENCE, **timing}
        settings.PRESENCE = presence
        setting_changed.send(sender=type(self), setting="PRESENCE", value=presence, enter=False)

    def reconnect_storm(self, faults: Faults) -> None:
        from tools.loadtest.storm import run_storm

        print("loadtest: reconnect storm: restarting process 0", flush=True)
        before = self.totals(self.generators.stats()).snapshots
        storm = run_storm(self, faults)
        after = self.totals(self.generators.stats()).snapshots
        print(f"loadtest: reconnect storm: {storm.row()}", flush=True)
        print(f"loadtest: reconnect storm, clients open again: {storm.timeline_row()}", flush=True)
        snapshots = {kind: after.get(kind, 0) - before.get(kind, 0) for kind in after}
        print(
            "loadtest: reconnect storm's snapshots: "
            f"{snapshots.get('whole', 0):,} whole, {snapshots.get('resuming', 0):,} resuming "
            f"({snapshots.get('users sent', 0):,} users sent, "
            f"{snapshots.get('users unchanged', 0):,} unchanged)",
            flush=True,
        )
        print(f"loadtest: reconnect storm floor: {storm.floor_row()}", flush=True)
        self.rows.append(("reconnect storm", storm.row()))
        self.rows.append(("  its floors", storm.floor_row()))
        self.storm_wrong = storm.wrong if storm.right_in is not None else max(1, storm.wrong)

    def checkpoint_times(self, faults: Any) -> list[tuple[float, str]]:
        seconds = self.sizes.seconds
        if self.args.quick and faults is None:
            # One checkpoint in the middle, then the final check: under a minute in all.
            return [(seconds / 2, "checkpoint"), (seconds / 2, "warmed up")]
        times: list[tuple[float, str]] = [(min(5.0, seconds / 3), "checkpoint")]
        # RSS is sampled after a warm-up: a quarter of the run, at most a minute.
        warmed_up = min(60.0, seconds / 4)
        if faults is not None:
            names = faults.names()
            # A soak long enough repeats the faults, one every FAULT_EVERY seconds or more.
            rounds = max(1, int((seconds - 10) // (len(names) * FAULT_EVERY)))
            step = (seconds - 10) / (rounds * len(names) + 1)
            for position in range(1, rounds * len(names) + 1):
                times.append((5 + step * position, names[(position - 1) % len(names)]))
            if rounds > 1:
                # Each fault's burst sets a high-water mark once (freed memory stays with the
                # process for reuse): growth is measured from the end of the first round, so
                # that it shows whether the repeated faults make the process grow on.
                warmed_up = 5 + step * len(names) + step / 2
        else:
            count = max(1, int(seconds // 30))
            for position in range(1, count + 1):
                times.append((seconds * position / (count + 1), "checkpoint"))
        times.append((warmed_up, "warmed up"))
        return sorted(times)

    def checkpoint(self, sample: int | None, final: bool = False) -> Any:
        """Pause the behaviours, let the last changes arrive, compare views with the oracle."""
        self.pause_behaviours()
        time.sleep(config.COALESCE_WINDOW + config.SWEEP_INTERVAL + 1)
        check = self.oracle.check(sample)
        label = "final" if final else "checkpoint"
        converged = "n/a" if check.converged_in is None else f"{check.converged_in:.1f} s"
        no_view = (
            f" (of them {len(check.no_view)} with no view: not ready or closed)"
            if check.no_view
            else ""
        )
        print(
            f"loadtest: {label}: {check.views} views, {check.entries} entries, "
            f"{check.first_wrong} differing at first"
            + (f", {check.first_no_view} with no view" if check.first_no_view else "")
            + f", {check.wrong} after {config.CONVERGENCE_BOUND} s{no_view} "
            f"(converged in {converged})",
            flush=True,
        )
        for example in check.examples[:3] if check.wrong else []:
            print(
                f"loadtest:   wrong: viewer {example[0]} target {example[1]}: "
                f"shown {example[2]}, oracle {example[3]}",
                flush=True,
            )
        if check.wrong:
            print(f"loadtest:   {check.diagnosis}", flush=True)
        if rooms.SHARE and not final:
            # While the behaviours are still paused; a sample, as the presence views.
            self.check_rooms("checkpoint", sample)
        if not final:
            self.resume_behaviours()
        return check

    def pause_behaviours(self) -> None:
        """Pause the clients' behaviours and the relation changes; the load's own time stops,
        and with it the count of the servers' CPU and of the page views (clock.py)."""
        opened = self.generators.ask("pause")
        self.relations.pause()
        if self.running.running:
            self.cpu.sample()
            self.running.pause(time.time())
            self.server_cpu.pause(self.cpu.readings("servers"))
            self.page_views.pause(dict(enumerate(opened)))

    def resume_behaviours(self) -> None:
        self.relations.resume()
        opened = self.generators.ask("resume")
        if not self.running.running:
            self.cpu.sample()
            self.running.resume(time.time())
            self.server_cpu.resume(self.cpu.readings("servers"))
            self.page_views.resume(dict(enumerate(opened)))

    def check_rooms(self, label: str, sample: int | None = None) -> rooms.RoomCheck:
        """Every client's room views (or a sample's) against room_presence (behaviours
        paused)."""
        result = rooms.check(
            self.room_views, config.CONVERGENCE_BOUND, self.hidden, self.blocked, sample
        )
        print(rooms.report(result, label), flush=True)
        if result.wrong:
            print(rooms.diagnose(result, self.relations.log), flush=True)
            # still counted wrong; says whether they missed an announcement
            print(
                rooms.reannounced(
                    result, self.room_views, config.CONVERGENCE_BOUND, self.hidden, self.blocked
                ),
                flush=True,
            )
        self.rooms_wrong += result.wrong
        self.rooms_leaked += result.oracle_leaks
        return result

    def room_views(self) -> list[rooms.RoomViewsOf]:
        return [view for part in self.generators.ask("room_views") for view in part]

    def lost_heartbeats(self) -> tuple[int, int]:
        """Users whose latest heartbeat is not in Redis (behaviours are paused by then)."""
        from presence.store import get_store

        beats = self.generators.beats()
        time.sleep(1.0)
        store = get_store()
        live = store.run(store.plans.read(list(beats))) or {}
        slack = config.HEARTBEAT_INTERVAL / 2 + 1.5
        lost = [
            user
            for user, at in beats.items()
            if not (state := live.get(user))
            or not state.connected
            or state.last_active is None
            or state.last_active < at - slack
        ]
        if lost:
            print(f"loadtest: heartbeats not recorded for users {lost[:10]}", flush=True)
        return len(lost), len(beats)

    def rss(self) -> list[int]:
        import psutil

        sizes = []
        for daphne in self.servers.daphnes:
            try:
                sizes.append(psutil.Process(daphne.pid).memory_info().rss if daphne.pid else 0)
            except psutil.Error:
                sizes.append(0)
        return sizes

    def process_groups(self) -> dict[str, list[int | None]]:
        """The processes the run started, by what they are (for the CPU meter)."""
        import os

        servers = self.servers
        redis = [servers.redis] if servers.redis else []
        nodes = servers.cluster.nodes if servers.cluster else []
        return {
            "servers": [daphne.pid for daphne in servers.daphnes],
            "generators": [process.pid for process in self.processes],
            "Redis": [
                server.process.pid
                for server in [*redis, *nodes, *servers.layer]
                if server.process is not None
            ],
            "harness": [os.getpid()],
        }

    def memory_rows(self) -> list[tuple[str, str]]:
        """What grew in each process never restarted, from its memory census (memory.py)."""
        from tools.loadtest.memory import at_or_after, breakdown, read_census

        rows = []
        for index, daphne in enumerate(self.servers.daphnes):
            if index in self.restarted or not daphne.pid:
                continue
            census = read_census(self.work, daphne.pid)
            start = at_or_after(census, self.warmed_up_at)
            end = ([line for line in census if line["at"] <= self.load_ended_at] or [None])[-1]
            if start and end and end["at"] > start["at"]:
                rows.append((f"memory of process {index}", breakdown(start, end)))
        return rows

    def orphans(self) -> dict[str, int]:
        """Once every client has left (and the grace, the TTL and the page views' window have
        passed): presence keys beyond the documented layout's leftovers, and group keys."""
        import redis

        # Connections a failed close left behind count as gone after CONNECTION_TTL.
        longest = max(config.OFFLINE_GRACE, config.ONLINE_WINDOW, config.CONNECTION_TTL)
        time.sleep(longest + 2 * config.SWEEP_INTERVAL + 2)
        found = {"conns": 0, "expiries": 0, "due": 0, "seen online": 0, "groups": 0}
        if self.servers.cluster:
            nodes = [redis.Redis(port=n.port) for n in self.servers.cluster.nodes if n.running]
        else:
            nodes = [redis.Redis.from_url(self.servers.redis_url)]
        now = time.time()
        for node in nodes:
            for key in scan_keys(node, "presence:*"):
                name = key.decode()
                if name.endswith(":conns"):
                    found["conns"] += int(node.hlen(key))
                elif name.endswith(":expiries"):
                    found["expiries"] += int(node.zcard(key))
                elif name.endswith(":due"):
                    found["due"] += int(node.zcard(key))
                elif name.endswith(":seen"):
                    # Last seen stays (cleanup persists and removes it later); nobody may still
                    # count as connected or online.
                    entries: Any = node.zrange(key, 0, -1, withscores=True)
                    for _member, raw_score in entries:
                        score = int(raw_score)
                        if score > 0 and (score // 32 + config.ONLINE_WINDOW > now or score & 16):
                            found["seen online"] += 1
            node.close()
        if rooms.SHARE:
            found.update(self.room_leftovers())
        killed = self.faults.killed_prefixes if self.faults is not None else set()
        left_by_killed = 0
        for server in self.servers.layer:
            client = redis.Redis.from_url(server.url)
            for key in scan_keys(client, "asgi:group:*"):
                members = [m.decode() for m in client.zrange(key, 0, -1)]
                mine = [m for m in members if calibrate.process_of(m) in killed]
                left_by_killed += len(mine)
                if len(mine) < len(members):
                    found["groups"] += 1
            client.close()
        if left_by_killed:
            # Not counted: a SIGKILLed process cannot leave its groups; channels_redis drops
            # such memberships after group_expiry (docs/reliability.md).
            print(
                f"loadtest: {left_by_killed} group memberships of the killed process remain "
                "(they expire after the layer's group_expiry)",
                flush=True,
            )
        return found

    def room_leftovers(self) -> dict[str, int]:
        """Once everyone left (the sweeps had their time): presence_cleanup runs as an operator
        would, then every room key still in Redis is an orphan (docs/rooms.md: a room whose
        last member left has no key left)."""
        import io

        import redis
        from django.core.management import call_command

        if self.servers.cluster:
            nodes = [redis.Redis(port=n.port) for n in self.servers.cluster.nodes if n.running]
        else:
            nodes = [redis.Redis.from_url(self.servers.redis_url)]
        try:
            # What the hubs' sweeps left (told, not counted: the cleanup is the backstop)...
            swept = rooms.leftover_keys(nodes, quiet=True)
            call_command("presence_cleanup", stdout=io.StringIO())
            # ... and what even the cleanup left: orphans.
            left = rooms.leftover_keys(nodes)
        finally:
            for node in nodes:
                node.close()
        print(
            "loadtest: room keys once everyone left: "
            + ", ".join(f"{k} {v}" for k, v in swept.items())
            + " before presence_cleanup, "
            + ", ".join(f"{k} {v}" for k, v in left.items())
            + " after it",
            flush=True,
        )
        self.rooms_row += (
            f"; room keys after all left: {swept['room keys']} before presence_cleanup, "
            f"{left['room keys']} after"
        )
        return left

    def scan_logs(self) -> LogScan:
        scan = LogScan()
        for daphne in self.servers.daphnes:
            last_time = 0.0
            for line in daphne.log_path.read_text(errors="replace").splitlines():
                match = LOG_RECORD.match(line)
                if match:
                    last_time = float(match.group(1))
                    level, message = match.group(2), match.group(4)
                    bad = level in ("ERROR", "CRITICAL") or "is unavailable" in message
                    if level == "WARNING" and not bad:
                        scan.warnings += 1
                        continue
                elif line.startswith("Traceback") or " ERROR " in line:
                    bad = True
                else:
                    continue
                if not bad:
                    continue
                if any(w.covers(last_time) for w in self.windows):
                    scan.excused += 1
                else:
                    scan.errors.append(f"{daphne.log_path.name}: {line[:200]}")
        return scan

    @staticmethod
    def totals(parts: list[Stats]) -> Stats:
        total = Stats()
        for part in parts:
            for name, value in vars(part).items():
                current = getattr(total, name)
                if isinstance(value, dict):
                    merged = dict(current)
                    for key, count in value.items():
                        merged[key] = merged.get(key, 0) + count
                    setattr(total, name, merged)
                else:
                    setattr(total, name, current + value)
        return total

    def after_opening(self, samples: list[tuple[float, float]]) -> str:
        """p50 / p99 of the samples taken after the opening."""
        return report.p50_p99([lag for at, lag in samples if at >= self.steady_from])

    def outside_windows(self, events: list[Any]) -> tuple[list[Any], int]:
        kept = [e for e in events if not any(w.covers(e[0]) for w in self.windows)]
        return kept, len(events) - len(kept)

    def summarize(
        self,
        stats: Stats,
        before: Stats,
        during: Stats,
        load_seconds: float,
        wall_seconds: float,
        checks: list[Any],
        final: Any,
        beats_lost: int,
        beats_checked: int,
        rss_start: list[int] | None,
        rss_end: list[int],
        orphans: dict[str, int],
        total_seconds: float,
    ) -> int:
        sizes = self.sizes
        # Changes made once the behaviours had run steady_after seconds (pauses not counted).
        steady_at = self.running.wall_at(self.steady_after)
        self.steady_from = float("inf") if steady_at is None else steady_at
        latencies = [latency for _, latency in stats.latencies]
        steady = [latency for made, latency in stats.latencies if made >= self.steady_from]
        p50 = report.percentile(latencies, 0.5)
        p99 = report.percentile(latencies, 0.99)
        closes, closes_excused = self.outside_windows(stats.unrequested)
        http_errors, http_excused = self.outside_windows(stats.http_5xx)
        logs = self.scan_logs()
        # An error frame during a fault (internal_error while the database is cut off) is
        # the documented answer: excused inside the fault's window, like closes.
        exceptions, exceptions_excused = self.outside_windows(stats.exceptions)
        errors = len(closes) + len(http_errors) + len(logs.errors) + len(exceptions)
        errors += len(self.relations.failures)
        wrong = final.wrong + sum(c.wrong for c in checks if c is not None)
        leaked = len(stats.leaks) + final.oracle_leaks + sum(c.oracle_leaks for c in checks)
        leaked += self.rooms_leaked
        frames = (during.frames_sent + during.frames_received) - (
            before.frames_sent + before.frames_received
        )
        http = during.http_requests - before.http_requests
        # Changes made during a fault wait for it to end (documented): their figure apart.
        calm = [
            latency
            for made, latency in stats.latencies
            if made >= self.steady_from and not any(w.covers(made) for w in self.windows)
        ]
        calm_row = (
            [
                (
                    "  outside fault windows",
                    f"{report.p50_p99(calm)} ms ({len(calm):,} diffs, after the opening)",
                )
            ]
            if self.windows
            else []
        )
        rows = [
            ("connections", f"{sizes.connections:,}"),
            ("processes", f"{sizes.processes} daphne, {sizes.generators} generators"),
            ("users", f"{sizes.users:,}"),
            ("presence Redis", "3-master cluster" if self.servers.cluster else "one server"),
            ("channel layer", f"{self.args.layer}, sharded over {len(self.servers.layer)} servers"),
            ("database", "PostgreSQL" if self.args.database else "SQLite (WAL)"),
            (
                "load duration",
                f"{load_seconds:.1f} s with the behaviours running ({wall_seconds:.1f} s in all, "
                "checks and pauses included)",
            ),
            # Heartbeats and diffs flow through the pauses too: over the whole time.
            ("frames/s (both ways)", f"{frames / max(wall_seconds, 1e-9):,.0f}"),
            ("heartbeats sent", f"{stats.heartbeats:,}"),
            ("HTTP page views/s", f"{http / max(load_seconds, 1e-9):,.1f}"),
            (
                "behaviours",
                f"{stats.reloads} reloads, {stats.tab_closes} tab closes, {stats.status_changes} "
                f"status changes, {stats.idle_switches} idle switches; per second running "
                f"{(stats.reloads + stats.tab_closes) / max(load_seconds, 1e-9):.1f} page views "
                f"over sockets (planned {self.planned_rate:.1f}), "
                f"{stats.status_changes / max(load_seconds, 1e-9):.1f} status changes (planned "
                f"{sizes.status_per_second * sizes.connections * self.mix_scale:.1f})",
            ),
            ("relation changes", ", ".join(f"{v} {k}" for k, v in self.relations.counts.items())),
            (
                "fan-out p50 / p99",
                f"{report.ms(p50)} / {report.ms(p99)} ms ({len(latencies):,} diffs)",
            ),
            (
                "  after the opening",
                f"{report.p50_p99(steady)} ms ({len(steady):,} diffs, changes "
                f"made {self.steady_after:.0f} s into the load and later)",
            ),
            *calm_row,
            (
                "  behind meanwhile",
                f"generators' event loops {self.after_opening(stats.loop_lags)}; servers' hubs "
                f"{self.after_opening(self.hub_lags.samples)} (p50 / p99 ms of their samples "
                "after the opening: a diff waits as long in either)",
            ),
            (
                "  status changes written",
                f"{self.after_opening(stats.written)} ms p50 / p99 after the opening (the "
                "server's answer to the client that made the change, before any announcement)",
            ),
            *self.rows,
        ]
        for number, check in enumerate(checks, start=1):
            rows.append(
                (
                    f"checkpoint {number}",
                    f"{check.views} views, {check.first_wrong} differing at first, "
                    f"{check.wrong} wrong",
                )
            )
        rows.append(
            (
                "final check",
                f"{final.views} views / {final.entries:,} entries, "
                f"{final.first_wrong} differing at first, {final.wrong} wrong"
                + (f" ({len(final.no_view)} with no view: not ready)" if final.no_view else ""),
            )
        )
        if self.rooms_row:
            rows.append(("rooms (final check)", self.rooms_row))
        rows.append(("heartbeats checked", f"{beats_checked} users, {beats_lost} not recorded"))
        for window in self.windows:
            converged = (
                "did not converge"
                if window.converged_in is None
                else f"{window.converged_in:.1f} s"
            )
            if window.wrong_after:
                converged += f" ({window.wrong_after} views still wrong, then reloaded)"
            rows.append((f"fault: {window.name}", f"converged in {converged}{window.note}"))
        growth_max = 0.0
        if rss_start:
            # A process restarted by a fault starts over: its growth says nothing.
            growth = [
                (end - start) / start * 100
                for index, (start, end) in enumerate(zip(rss_start, rss_end, strict=False))
                if start and index not in self.restarted
            ] or [0.0]
            growth_max = max(growth) / 100
            if self.args.soak:
                rows.append(
                    (
                        "RSS timeline (MB)",
                        "; ".join(
                            f"{seconds:.0f} s {action}: "
                            + "/".join(f"{size / 2**20:.0f}" for size in sizes)
                            for seconds, action, sizes in self.rss_timeline
                        ),
                    )
                )
            rows.extend(self.memory_rows())
            rows.append(
                (
                    "RSS after warm-up → end",
                    ", ".join(
                        f"{s / 2**20:.0f}→{e / 2**20:.0f} MB"
                        for s, e in zip(rss_start, rss_end, strict=False)
                    )
                    + f" (max growth {max(growth):+.1f} %)",
                )
            )
        rows.append(("CPU during the load (cores)", self.cpu.row()))
        if self.bare is not None:
            from tools.loadtest.calibrate import cpu_row

            # While the behaviours ran only: a check's minutes of heartbeats would count
            # against the few page views made before it.
            ours = cpu_row(self.server_cpu.total, int(self.page_views.total), self.bare)
            rows.append(("servers' CPU per page view", ours))
        rows.append(("orphans after all left", ", ".join(f"{k} {v}" for k, v in orphans.items())))
        rows.append(
            (
                "errors",
                f"{len(closes)} unrequested closes, {len(http_errors)} HTTP 5xx, "
                f"{len(logs.errors)} log errors, {len(exceptions)} client exceptions, "
                f"{len(self.relations.failures)} harness failures "
                f"({closes_excused + http_excused + logs.excused + exceptions_excused} "
                "inside fault windows; "
                f"{logs.warnings} log warnings)",
            )
        )
        rows.append(("total time", f"{total_seconds:.1f} s"))
        print()
        print(report.table(rows))
        codes: dict[str, int] = {}
        for _at, code, _index in stats.unrequested:
            codes[code] = codes.get(code, 0) + 1
        if codes:
            print(f"loadtest: unrequested closes by code (all, faults included): {codes}")
        kinds: dict[str, int] = {}
        for _at, what in stats.exceptions:
            kind = what.split("'message'")[0][:80]
            kinds[kind] = kinds.get(kind, 0) + 1
        if kinds:
            print(f"loadtest: client exceptions and error frames (all, faults included): {kinds}")
        for line in (
            [f"close {c}" for c in closes[:5]]
            + [f"http {h}" for h in http_errors[:5]]
            + logs.errors[:10]
            + [f"{what} at {at:.1f}" for at, what in exceptions[:5]]
            + self.relations.failures[:5]
            + [f"leak {leak}" for leak in stats.leaks[:5]]
        ):
            print(f"loadtest:   {line}")
        if logs.errors:
            print(f"loadtest: server logs in {self.work}")
        orphaned = sum(orphans.values())
        if orphaned:
            errors += orphaned
        if self.cpu.saturated:
            print(
                f"loadtest: the machine was busy {self.cpu.machine_busy() * 100:.0f} % of the "
                "load: its latencies and convergence measure the machine as much as presence"
            )
        if rss_start and self.args.soak and growth_max > 0.05:
            errors += 1
            print(f"loadtest: RSS grew {growth_max * 100:.1f} % (> 5 %)")
        for window in self.windows:
            wrong += window.wrong_after
        wrong += self.storm_wrong
        wrong += self.rooms_wrong
        if self.signal_check.failed:
            errors += 1  # a signal lost or doubled (tools/loadtest/signals.py)
        print(
            report.final_line(
                sizes.connections, sizes.processes, p50, p99, beats_lost, wrong, leaked, errors
            ),
            flush=True,
        )
        return 1 if (beats_lost or wrong or leaked or errors) else 0

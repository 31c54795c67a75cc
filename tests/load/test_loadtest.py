"""The load test's pure parts (tools/loadtest): the oracle's comparison counting wrong views and
leaks, the power-law graph's shape, and the final line scripts read. The load itself runs with
``make loadtest``."""

from __future__ import annotations

import itertools
import json
import random
import re
import statistics

import pytest

from tools.loadtest import oracle, population, report
from tools.loadtest.generator import PresenceTuple, reveals

ONLINE: PresenceTuple = ("online", "2025-01-31T09:30:00+00:00", ("web",), None, None, None)
HIDDEN: PresenceTuple = ("offline", None, (), None, None, None)


def test_an_online_user_agrees_whatever_their_last_seen() -> None:
    later = ("online", "2025-01-31T09:31:00+00:00", ("web",), None, None, None)
    assert oracle.agrees(ONLINE, later)
    assert not oracle.agrees(ONLINE, ("idle", *later[1:]))
    assert not oracle.agrees(ONLINE, ("online", later[1], ("mobile",), None, None, None))


def test_an_offline_user_is_compared_with_their_last_seen() -> None:
    seen = ("offline", "2025-01-31T09:30:00+00:00", (), None, None, None)
    assert oracle.agrees(seen, seen)
    assert not oracle.agrees(seen, HIDDEN)
    assert not oracle.agrees(None, HIDDEN)  # never shown at all


def test_compare_counts_views_with_any_differing_entry() -> None:
    views = [(0, 1, {2: ONLINE, 3: HIDDEN}), (1, 4, {2: HIDDEN}), (2, 5, {2: ONLINE})]
    expected = {1: {2: ONLINE, 3: HIDDEN}, 4: {2: ONLINE}, 5: {2: ONLINE, 3: ONLINE}}
    result = oracle.compare(views, expected, hidden=set(), blocked_pairs=set())
    assert result.views == 3
    assert result.entries == 5
    assert result.wrong == [1, 2]
    assert result.wrong_entries == 2
    assert result.oracle_leaks == []


def test_compare_counts_the_oracle_showing_a_hidden_user_as_a_leak() -> None:
    views = [(0, 1, {7: ONLINE, 8: ONLINE})]
    expected = {1: {7: ONLINE, 8: ONLINE}}
    result = oracle.compare(views, expected, hidden={7}, blocked_pairs={(1, 8)})
    assert result.oracle_leaks == [(1, 7), (1, 8)]
    assert result.wrong == []


def test_a_hidden_look_reveals_nothing_and_anything_else_does() -> None:
    assert not reveals(HIDDEN)
    assert reveals(ONLINE)
    assert reveals(("offline", "2025-01-31T09:30:00+00:00", (), None, None, None))
    assert reveals(("offline", None, (), "Focus", None, None))


def test_contact_degrees_have_the_asked_median_and_a_capped_tail() -> None:
    degrees = population.contact_degrees(20_000, 150, 5_000, 3, random.Random(1))
    assert 140 <= statistics.median(degrees) <= 160
    assert max(degrees) == 5_000
    assert sum(1 for d in degrees if d == 5_000) >= 3
    assert min(degrees) >= 100  # a Pareto law starts at its scale


def test_the_graph_keeps_its_median_with_returned_follows() -> None:
    graph = population.build_graph(2_000, 150, 1_000, 2, hidden=10, seed=3)
    assert 135 <= population.median_degree(graph) <= 165
    assert all(owner not in contacts for owner, contacts in enumerate(graph.contacts))
    assert len(graph.hidden) == 10
    assert all(graph.privacy[user] == "nobody" for user in graph.hidden)
    assert all(a != b for a, b in graph.blocks)


def test_the_final_line_has_the_format_scripts_read() -> None:
    line = report.final_line(10_000, 3, 0.0123, 0.25, 0, 2, 0, 5)
    assert line == (
        "load: 10000 connections, 3 processes, p50 12 ms, p99 250 ms, lost 0, wrong 2, "
        "leaked 0, errors 5"
    )
    pattern = (
        r"load: (\d+) connections, (\d+) processes, p50 (\S+) ms, p99 (\S+) ms, "
        r"lost (\d+), wrong (\d+), leaked (\d+), errors (\d+)"
    )
    assert re.fullmatch(pattern, line)
    assert "p50 n/a ms" in report.final_line(1, 1, None, None, 0, 0, 0, 0)


def test_percentiles() -> None:
    samples = [float(n) for n in range(1, 101)]
    assert report.percentile(samples, 0.5) == 51.0
    assert report.percentile(samples, 0.99) == 100.0
    assert report.percentile([], 0.5) is None


def test_the_load_counts_only_its_time_with_the_behaviours_running() -> None:
    from tools.loadtest.clock import Running

    running = Running()
    assert running.seconds(100.0) == 0.0
    running.resume(100.0)
    running.pause(105.0)  # a checkpoint of three minutes
    running.resume(285.0)
    running.resume(286.0)  # resuming again changes nothing
    assert running.seconds(300.0) == 20.0
    running.pause(300.0)
    running.pause(301.0)
    assert running.seconds(400.0) == 20.0
    # 10 s of load: 5 before the checkpoint, 5 after it.
    assert running.wall_at(4.0) == 104.0
    assert running.wall_at(10.0) == 290.0
    assert running.wall_at(20.0) == 300.0
    assert running.wall_at(21.0) is None


def test_cpu_and_page_views_count_over_the_running_intervals_only() -> None:
    from tools.loadtest.clock import Tally

    cpu = Tally()
    cpu.pause({1: 5.0})  # not running: nothing counted
    cpu.resume({1: 10.0, 2: 4.0})
    cpu.pause({1: 12.0, 2: 5.0})
    # Paused: a check's 100 s of CPU are not counted; process 2 died meanwhile (its last reading
    # kept) and process 3 started.
    cpu.resume({1: 112.0, 2: 5.0, 3: 1.0})
    # Process 4 started while running: counted from its start.
    cpu.pause({1: 113.0, 2: 5.0, 3: 1.5, 4: 0.25})
    assert cpu.total == 3.0 + 1.0 + 0.5 + 0.25


class _Faults:
    def names(self) -> list[str]:
        return ["kill", "restart", "pause", "terminate", "shard"]


def _schedule(seconds: float) -> list[tuple[float, str]]:
    from types import SimpleNamespace

    from tools.loadtest.run import Run

    run = SimpleNamespace(sizes=SimpleNamespace(seconds=seconds), args=SimpleNamespace(quick=True))
    return Run.checkpoint_times(run, _Faults())  # type: ignore[arg-type]


def test_a_long_fault_soak_repeats_the_faults_and_warms_up_over_the_first_round() -> None:
    from tools.loadtest.run import FAULT_EVERY

    times = _schedule(600)
    faults = [(at, name) for at, name in times if name in _Faults().names()]
    assert [name for _, name in faults] == _Faults().names() * 5
    assert all(b - a >= FAULT_EVERY for (a, _), (b, _) in itertools.pairwise(faults))
    assert faults[-1][0] < 600
    (warmed_up,) = [at for at, name in times if name == "warmed up"]
    # After every fault has happened once, before the second round.
    assert faults[4][0] < warmed_up < faults[5][0]


def test_a_short_fault_run_has_each_fault_once_and_a_quarter_as_warm_up() -> None:
    times = _schedule(120)
    assert [name for _, name in times if name in _Faults().names()] == _Faults().names()
    assert [at for at, name in times if name == "warmed up"] == [30.0]


def test_the_memory_census_breaks_growth_down_and_skips_a_line_cut_by_a_kill(tmp_path) -> None:
    from tools.loadtest import memory

    first = memory.sample(memory._libc_mallinfo2())
    assert first["rss"] > 0 and first["blocks"] > 0 and first["threads"] >= 1
    later = {**first, "at": first["at"] + 5, "rss": first["rss"] + 3 * 2**20}
    later["linecache"] = first["linecache"] + 2**20
    later["blocks"] = first["blocks"] + 1234
    (tmp_path / "memory-42.jsonl").write_text(
        json.dumps(first) + "\n" + json.dumps(later) + "\n" + '{"at": 1'
    )
    census = memory.read_census(tmp_path, 42)
    assert census == [first, later]
    assert memory.at_or_after(census, first["at"] + 1) == later
    assert memory.at_or_after(census, later["at"] + 1) is None
    text = memory.breakdown(first, later)
    assert text.startswith("rss +3.0 MB")
    assert "linecache +1.0" in text
    assert "Python blocks +1,234" in text


def test_only_a_servers_first_start_takes_the_memory_census(tmp_path) -> None:
    # The memory rows read only processes never restarted; a census sample inside a storm's
    # timed window would stall the restarted server, which the bare floors do not pay.
    from tools.loadtest.servers import BARE, DaphneProcess

    env = {"LOADTEST_MEMORY_DIR": str(tmp_path), "OTHER": "kept"}
    site = DaphneProcess(0, env, tmp_path)
    assert site.start_env() == env
    site.starts = 1  # as start() counts them: a restart after a kill
    assert site.start_env() == {"OTHER": "kept"}
    floor = DaphneProcess(1, env, tmp_path, BARE, "bare", census=False)
    assert floor.start_env() == {"OTHER": "kept"}
    assert env["LOADTEST_MEMORY_DIR"] == str(tmp_path)  # the run's own environment unchanged


def test_the_cpu_meter_counts_each_process_from_its_own_start_and_keeps_a_dead_ones_seconds() -> (
    None
):
    import subprocess
    import sys
    import time

    import psutil

    from tools.loadtest.cpu import CpuMeter
    from tools.processes import stop_process

    burn = "import time\nwhile time.process_time() < 0.5: pass\ntime.sleep(30)"
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
    )
    burner: subprocess.Popen[bytes] | None = None
    groups: dict[str, list[int | None]] = {"idle": [sleeper.pid], "busy": []}
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == b"ready\n"
        meter = CpuMeter(lambda: groups)
        meter.start()
        burner = subprocess.Popen([sys.executable, "-c", burn])
        groups["busy"] = [burner.pid]
        deadline = time.monotonic() + 10
        while sum(psutil.Process(burner.pid).cpu_times()[:2]) < 0.4:
            assert time.monotonic() < deadline, "the burner never burned"
            time.sleep(0.05)
        meter.sample()  # the burner counts from its start, not from the meter's
        stop_process(burner, timeout=5, kill=True)
        meter.sample()  # gone now: it keeps what it used until the last sample that saw it
        cores = meter.cores()
    finally:
        stop_process(sleeper, timeout=5, kill=True)
        stop_process(burner, timeout=5, kill=True)
    (busy,) = cores["busy"]
    (idle,) = cores["idle"]
    elapsed = meter.ended_at - meter.started_at
    assert busy * elapsed >= 0.4
    assert idle * elapsed < 0.05
    assert 0 < meter.machine_busy() <= 1
    assert "machine busy" in meter.row()


def test_a_storm_reports_its_time_and_its_cpu_per_client() -> None:
    from tools.loadtest.storm import Storm

    storm = Storm(clients=250, restart=1.5, reopened_in=9.4, right_in=12.4, server_cpu=4.4)
    assert storm.cpu_per_client() == 4.4 / 250
    assert "every view right 12.4 s after it answered again" in storm.row()
    assert "17.6 ms per client" in storm.row()
    late = Storm(clients=3000, last_ready=1565, wrong=1584)
    assert "not all right after 120 s (1565 open" in late.row()


def test_a_storm_is_compared_with_its_bare_floor() -> None:
    from tools.loadtest.storm import Storm

    storm = Storm(clients=3000, right_in=24.0, bare_in=6.0, bare_cpu=9.0, killed_in=12.0)
    storm.bare_failures = {"TimeoutError": 2}
    assert storm.at_once_ratio() == 4.0
    row = storm.floor_row()
    assert "all 3,000 had their frame in 6.0 s at once" in row
    assert "3.0 ms per client" in row
    assert "2 TimeoutError" in row
    assert row.endswith("ours 24.0 s: ratio 4.0 at once, 2.0 after a kill")
    # Ours not all right within the timeout: the ratio is at least the timeout's.
    late = Storm(clients=3000, right_in=None, bare_in=6.0, killed_in=12.0)
    assert late.ratio() is None and late.at_once_ratio() is None
    assert late.floor_row().endswith(
        "ours not all right within 120 s: ratio above 20.0 at once, above 10.0 after a kill"
    )
    # A floor not done within the timeout: ours is at most that many times it.
    slow = Storm(clients=3000, right_in=24.0, bare_in=None, killed_in=12.0)
    assert slow.floor_row().endswith("ratio below 0.2 at once, 2.0 after a kill")
    exited = Storm(clients=1, bare_note="it exited", killed_note="it exited").floor_row()
    assert "at once not measured (it exited)" in exited
    assert "after the same kill and restart not measured (it exited)" in exited
    assert exited.endswith("ratio none at once, none after a kill")


def test_the_storms_goal_is_over_its_floor_after_the_same_kill() -> None:
    from tools.loadtest.storm import Storm

    storm = Storm(clients=3000, right_in=25.3, bare_in=7.1, bare_cpu=9.0)
    storm.killed_in, storm.killed_restart, storm.killed_cpu = 11.0, 4.2, 6.0
    storm.killed_failures = {"ConnectionRefusedError": 5400}
    assert storm.ratio() == pytest.approx(25.3 / 11.0)
    assert storm.at_once_ratio() == pytest.approx(25.3 / 7.1)
    row = storm.floor_row()
    assert (
        "; after the same kill and restart in 11.0 s (its restart 4.2 s; its CPU 6.0 s, 2.0 ms "
        "per client; failed reconnections: 5,400 ConnectionRefusedError); " in row
    )
    assert row.endswith("ours 25.3 s: ratio 3.6 at once, 2.3 after a kill")
    # Not all held a socket before the kill: no floor after a kill, and no goal's ratio.
    unheld = Storm(clients=3000, right_in=25.3, bare_in=7.1, killed_note="2,990 of 3,000 held")
    assert unheld.ratio() is None
    assert "after the same kill and restart not measured (2,990 of 3,000 held)" in (
        unheld.floor_row()
    )
    timed_out = Storm(clients=3000, right_in=25.3, bare_in=7.1, killed_in=None)
    assert timed_out.ratio() is None
    assert "after the same kill and restart not all within 120 s (its restart" in (
        timed_out.floor_row()
    )


def test_the_storms_timeline_shows_its_shape_in_a_few_marks() -> None:
    from tools.loadtest.storm import Storm

    storm = Storm(clients=3000)
    storm.timeline = [(second, 100 * second) for second in range(25)]
    # About eight marks, always ending with the last look.
    assert storm.timeline_row() == (
        "0 s 0, 3 s 300, 6 s 600, 9 s 900, 12 s 1,200, 15 s 1,500, 18 s 1,800, 21 s 2,100, "
        "24 s 2,400"
    )
    storm.timeline = [(0, 5), (1, 40)]
    assert storm.timeline_row() == "0 s 5, 1 s 40"


def test_the_rest_of_the_mix_follows_the_page_views_share_of_the_plan() -> None:
    from tools.loadtest import config
    from tools.loadtest.run import mix_scale

    sizes = config.Sizes.for_mode(quick=False)
    planned = sizes.churn_per_second * sizes.connections  # 200 page views a second
    assert mix_scale(planned / 4, sizes) == pytest.approx(0.25)
    # Never above the plan, whatever rate is asked for.
    assert mix_scale(planned * 3, sizes) == 1.0


def test_reconnection_backs_off_as_presence_js_does() -> None:
    from tools.loadtest.generator import RATE_LIMITED, RETRY_MAX, retry_delay

    # Doubling from 1 s with half of it random: 0.5-1, 1-2, 2-4 s ... up to 30 s.
    assert [retry_delay(n, "1006", 0.0) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert [retry_delay(n, "1006", 0.999) for n in (1, 2, 3)] == pytest.approx(
        [0.9995, 1.999, 3.998]
    )
    assert retry_delay(20, "open:TimeoutError", 1.0) == RETRY_MAX
    # Told to slow down (rate limited, too slow a reader): at least 10 s.
    assert retry_delay(1, "4429", 0.0) == RATE_LIMITED
    assert retry_delay(1, "4408", 0.5) == RATE_LIMITED


def test_auto_paces_the_heartbeats_from_their_measured_cost() -> None:
    from tools.loadtest.calibrate import HEARTBEAT_SHARE, Bare, Ours, plan

    bare = Bare(clients=1000, cpu=3.0, seconds=5.0)  # 3 ms per page view
    # 0.4 ms per heartbeat: 10,000 sockets within 15 % of 2 cores beat every 14 s.
    ours = Ours(opened=500, opening_cpu=5.0, beats=2000, beat_cpu=0.8)
    chosen = plan(bare, ours, 10_000, default_heartbeat=2, default_rate=200.0, cores=2.0)
    assert chosen.heartbeat == 14
    assert 10_000 * 0.0004 / chosen.heartbeat <= HEARTBEAT_SHARE * 2
    assert "heartbeat every 14 s" in " ".join(chosen.why)
    # Cheap heartbeats keep the compressed pace; dear ones stop at the slowest.
    cheap = Ours(opened=500, opening_cpu=5.0, beats=2000, beat_cpu=0.01)
    assert plan(bare, cheap, 10_000, 2, 200.0, cores=2.0).heartbeat == 2
    dear = Ours(opened=500, opening_cpu=5.0, beats=2000, beat_cpu=100.0)
    assert plan(bare, dear, 10_000, 2, 200.0, cores=2.0).heartbeat == 30


def test_auto_paces_page_views_and_the_opening_at_ours_when_dearer_than_planned() -> None:
    from tools.loadtest.calibrate import MAX_OPENING, Bare, Ours, plan

    bare = Bare(clients=1000, cpu=3.0, seconds=5.0)
    ours = Ours(opened=500, opening_cpu=5.0, beats=2000, beat_cpu=0.8)  # 10 ms per opening
    chosen = plan(bare, ours, 10_000, 2, 200.0, cores=2.0)
    # A quarter of 2 cores at 10 ms (above twice bare's 3 ms): 50 page views a second.
    assert chosen.rate == pytest.approx(50.0)
    # 40 % of 2 cores at 10 ms: 80 sockets a second, 125 s for 10,000.
    assert chosen.opening == pytest.approx(80.0)
    # Ours cheaper than the goal: twice bare's is planned; the opening is at most MAX_OPENING.
    cheap = Ours(opened=500, opening_cpu=1.0, beats=2000, beat_cpu=0.8)
    assert plan(bare, cheap, 10_000, 2, 200.0, cores=2.0).rate == pytest.approx(0.5 / 0.006)
    # Fewer cores free: slower, as the cost measured allows (500 s for 10,000 here)...
    slow = plan(bare, ours, 10_000, 2, 200.0, cores=0.5)
    assert slow.opening == pytest.approx(20.0)
    # ...down to the bound of a machine far too busy.
    crowded = plan(bare, ours, 10_000, 2, 200.0, cores=0.05)
    assert crowded.opening == pytest.approx(10_000 / MAX_OPENING)
    assert f"at least 10,000 in {MAX_OPENING:.0f} s" in crowded.why[-1]


def test_the_opening_pace_follows_the_servers_cpu_within_the_plan() -> None:
    from tools.loadtest.calibrate import MIN_PACE, Bare, Ours, next_pace, plan

    bare = Bare(clients=1000, cpu=3.0, seconds=5.0)
    ours = Ours(opened=500, opening_cpu=5.0, beats=2000, beat_cpu=0.8)
    # The opening may use its share and the heartbeats' of the cores free: 55 % of 2.
    assert plan(bare, ours, 10_000, 2, 200.0, cores=2.0).opening_cores == pytest.approx(1.1)
    # Over the budget: cut to it; a server behind its channel: halved, whatever its CPU.
    assert next_pace(1.0, cores=1.5, budget=1.0, late=False) == pytest.approx(2 / 3)
    assert next_pace(0.8, cores=0.2, budget=1.0, late=True) == pytest.approx(0.4)
    # Well under: a quarter faster, never above the plan; near it: kept.
    assert next_pace(0.4, cores=0.5, budget=1.0, late=False) == pytest.approx(0.5)
    assert next_pace(0.9, cores=0.1, budget=1.0, late=False) == 1.0
    assert next_pace(0.5, cores=0.9, budget=1.0, late=False) == 0.5
    # Never below MIN_PACE: the opening ends.
    assert next_pace(MIN_PACE, cores=9.0, budget=1.0, late=True) == MIN_PACE


def test_rate_and_heartbeat_given_are_kept_and_nothing_measured_keeps_the_defaults() -> None:
    from tools.loadtest.calibrate import Bare, Ours, plan

    bare = Bare(clients=1000, cpu=3.0, seconds=5.0)
    ours = Ours(opened=500, opening_cpu=5.0, beats=2000, beat_cpu=0.8)
    given = plan(bare, ours, 10_000, 2, 200.0, heartbeat=10, rate=87.0, cores=2.0)
    assert (given.heartbeat, given.rate) == (10, 87.0)
    assert "(--heartbeat)" in given.why[1] and "(--rate)" in given.why[0]
    failed = Ours(opened=10, opening_cpu=1.0, beats=0, note="490 of 500 sockets did not open")
    none = plan(Bare(note="exited"), failed, 10_000, 2, 200.0, cores=2.0)
    assert (none.heartbeat, none.rate, none.opening) == (2, 200.0, None)


def test_the_load_after_a_paced_opening_waits_for_servers_caught_up(tmp_path) -> None:
    from tools.loadtest.calibrate import QUIET, Bare, Ours, behind, plan

    log = tmp_path / "daphne-0.log"
    log.write_text(
        "1.000 WARNING presence Presence: announcements reach this process 24 s after "
        "they were sent: it is behind its channel, and the channel layer may drop\n"
    )
    assert behind(log)
    with log.open("a") as out:
        out.write(
            "2.000 WARNING presence Presence: this process caught up with its channel; "
            "resyncing views.\n"
        )
    assert not behind(log)
    bare = Bare(clients=1000, cpu=3.0, seconds=5.0)
    ours = Ours(opened=500, opening_cpu=5.0, beats=2000, beat_cpu=0.8)
    chosen = plan(bare, ours, 10_000, 2, 200.0, cores=2.0)
    # 10,000 sockets every 14 s at 0.4 ms: 0.29 cores of heartbeats, 1.5 times and a margin.
    assert chosen.caught_up_below(3) == pytest.approx(1.5 * 10_000 / 14 * 0.0004 + 3 * QUIET)
    # Opened at once (nothing measured): the load starts with the snapshots, as ever.
    assert plan(None, None, 500, 2, 10.0, cores=2.0).caught_up_below(2) is None


def test_the_calibration_process_memberships_are_forgotten_and_no_one_elses(
    redis_url: str,
) -> None:
    # The calibration's daphne is stopped once measured; memberships its closes did not leave
    # would be counted as the run's orphan groups.
    import redis

    from tools.loadtest import calibrate

    log = "Presence: the live hub listens on channel specific.abc123!x9.\n"
    assert calibrate.channels_of(log) == {"specific.abc123"}
    client = redis.Redis.from_url(redis_url)
    try:
        client.zadd("asgi:group:presence.u.1", {"specific.abc123!x9": 1, "specific.live!y1": 1})
        client.zadd("asgi:group:presence.u.2", {"specific.abc123!x9": 1})
        assert calibrate.forget_memberships([redis_url], {"specific.abc123"}) == 2
        assert client.zrange("asgi:group:presence.u.1", 0, -1) == [b"specific.live!y1"]
        assert not client.exists("asgi:group:presence.u.2")
    finally:
        client.delete("asgi:group:presence.u.1", "asgi:group:presence.u.2")
        client.close()

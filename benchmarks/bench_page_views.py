"""Page views: what one server process spends on the socket of a page, against Channels' own.

On a site built of pages every page view closes one WebSocket and opens another. One daphne
process (``benchmarks.page_views_asgi`` on a free 127.0.0.1 port, stopped by its pid) serves
both sides; the client is another process (``benchmarks.page_views_client``: the ``websockets``
client over loopback), so that its CPU is not the server's.

- ours: open ``ws/presence/`` with a session cookie, subscribed in the opening request's URL (as
  presence.js does; ``BENCH_PAGE_VIEWS_SUBSCRIBE=frame``: with a subscribe frame once open) to
  the viewer's 50 users (a graph with a privacy mix, contacts, some blocks, half of them online)
  with the stamp of the page rendered a moment before (presence.stamps, as presence.js does with
  the dots' stamp), wait for the answer (only what changed since), send one heartbeat, close;
- bare: open ``ws/bare/``, a consumer behind ``AuthMiddlewareStack`` that accepts, reads
  ``scope["user"]``, answers one frame and closes.

Phases alternate side by side (bare, ours, then ours, bare, ...): at a fixed offered rate, then
at saturation (a fixed number of page views always in flight). Server CPU per page view is the
process's utime + stime (``/proc/<pid>/stat``) over the phase / page views done. Page views/s of
a process is 1 / that (a process saturates one core: the figure does not depend on whether the
client or the machine's other load held the phase back); the wall rate is shown beside it.
Reconnects, side by side at saturation: ``full`` (no stamp: the full snapshot, as a reconnect
without resume, or a page of the site's own markup) and ``resume`` (the stamp of the viewer's
last answer): frames and server CPU per reconnect.

Finally 20 pages are rendered (``bulk_presence`` and the page's stamp, as the tags do), some of
their users change (a status, privacy, an exception, a block, a contact removed, going online),
and the socket's answer merged onto each page is checked against ``bulk_presence`` for the same
viewer (the one resolver): privacy and the snapshot as the rest of presence sees them.

``BENCH_PAGE_VIEWS_PROFILE=1``: the server runs under cProfile (its event loop's thread) and the
top functions (``BENCH_PAGE_VIEWS_TOP``, 20) of ours' last saturated phase are printed (and the
profile copied to ``BENCH_PAGE_VIEWS_KEEP``, a path, when set);
``=py-spy``: py-spy records ours' saturated phases (all threads), and the raw stacks are kept in
the file the run names, for a closer look.
"""

from __future__ import annotations

import json
import os
import pstats
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.core.cache import cache

from benchmarks.common import Report, Sizes, flush, median, raw_client, say
from presence import api, stamps
from presence.models import Block, Contact, PrivacyException, PrivacySettings
from tools.processes import stop_process
from tools.redis_server import free_port

NAME = "page_views"
ROOT = Path(__file__).resolve().parent.parent
DAPHNE = Path(sys.executable).parent / "daphne"
PAGE = 50
#: sockets open all along (see hold_resident)
RESIDENT = 20
#: the sides measured at saturation: page views (bare, ours) and reconnects (full, resume)
SATURATED = ("bare", "ours", "full", "resume")
APP = "benchmarks.page_views_asgi:application"
#: how ours subscribe: in the opening request's URL (``url``, presence.js), or with a subscribe
#: frame once open (``frame``: clients that do not put it in the URL)
SUBSCRIBE = os.environ.get("BENCH_PAGE_VIEWS_SUBSCRIBE", "url")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def build_site(targets: int, viewers: int, seed: int = 28) -> list[dict[str, Any]]:
    """Users (targets, then viewers), the targets' privacy mix, half of them online; each
    viewer's page of 50 targets: 20 mutual contacts (3 close friends), 2 blocks either way.
    Returns each viewer's page: its id, session cookie and the ids on its page."""
    rng = random.Random(seed)
    User = get_user_model()
    template = User(username="template")
    template.set_password("page-views")
    User.objects.bulk_create(
        User(username=f"pv{i}", password=template.password) for i in range(targets + viewers)
    )
    ids = list(
        User.objects.filter(username__startswith="pv").order_by("pk").values_list("pk", flat=True)
    )
    target_ids, viewer_ids = ids[:targets], ids[targets:]
    mix = [("everyone", False)] * 10 + [("contacts", False)] * 5 + [("close_friends", False)] * 2
    mix += [("nobody", False)] * 2 + [("everyone", True)]
    settings_rows = []
    for pk in target_ids:
        level, invisible = rng.choice(mix)
        settings_rows.append(
            PrivacySettings(
                user_id=pk,
                online_visibility=level,
                last_seen_visibility=level,
                activity_visibility=level,
                invisible=invisible,
            )
        )
    PrivacySettings.objects.bulk_create(settings_rows)
    for pk in target_ids[::2]:
        api.touch(pk)
    contacts: list[Contact] = []
    blocks: list[Block] = []
    pages = []
    for viewer in viewer_ids:
        page = rng.sample(target_ids, PAGE)
        for n, target in enumerate(page[:20]):
            contacts.append(Contact(owner_id=viewer, contact_id=target))
            contacts.append(Contact(owner_id=target, contact_id=viewer, close_friend=n < 3))
        blocks.append(Block(blocker_id=page[20], blocked_id=viewer))
        blocks.append(Block(blocker_id=viewer, blocked_id=page[21]))
        session = SessionStore()
        user = User.objects.get(pk=viewer)
        session[SESSION_KEY] = str(viewer)
        session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        pages.append(
            {"viewer": viewer, "cookie": f"sessionid={session.session_key}", "users": page}
        )
    Contact.objects.bulk_create(contacts)
    Block.objects.bulk_create(blocks)
    return pages


class Server:
    """daphne serving ``benchmarks.page_views_asgi`` on the benchmark's database and Redis."""

    def __init__(self, profile: str | None) -> None:
        self.port = free_port()
        self.profile = profile
        self.log = tempfile.NamedTemporaryFile(prefix="page-views-daphne-", suffix=".log")  # noqa: SIM115
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "benchmarks.page_views_settings",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "MALLOC_ARENA_MAX": "2",
        }
        if profile:
            env["BENCH_PROFILE"] = profile
        self.process = subprocess.Popen(
            [*(str(DAPHNE), "-v", "0", "-b", "127.0.0.1", "-p", str(self.port)), APP],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/"

    def wait_ready(self, pages: list[dict[str, Any]]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daphne exited:\n{self.output()}")
            result = run_client(self, pages, "bare", seconds=0.05, concurrency=1)
            if result["done"]:
                return
            time.sleep(0.3)
        raise RuntimeError(f"daphne did not serve:\n{self.output()}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def dump_profile(self) -> None:
        self.process.send_signal(signal.SIGUSR1)
        time.sleep(1.0)

    def stop(self) -> None:
        stop_process(self.process, timeout=15)
        self.log.close()


def run_client(
    server: Server,
    pages: list[dict[str, Any]],
    mode: str,
    seconds: float,
    rate: float = 0,
    concurrency: int = 1,
    keep: int = 0,
    stamps: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec = {
        "stamps": stamps or {},
        "url": server.url,
        "origin": f"http://127.0.0.1:{server.port}",
        "mode": mode,
        "pages": pages,
        "seconds": seconds,
        "rate": rate,
        "in_flight": 200,
        "concurrency": concurrency,
        "keep": keep,
        "subscribe": SUBSCRIBE,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec_file:
        json.dump(spec, spec_file)
        spec_file.flush()
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.page_views_client", spec_file.name],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=seconds + 120,
        )
    if done.returncode:
        raise RuntimeError(f"page-view client failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def hold_resident(server: Server, pages: list[dict[str, Any]], count: int) -> subprocess.Popen[str]:
    """Sockets open all along (other tabs, on a real site): the hub stays up between page
    views, as in any busy process. Their heartbeats are the server's cost too, in both phases."""
    spec = {
        "url": server.url,
        "origin": f"http://127.0.0.1:{server.port}",
        "mode": "hold",
        "pages": pages,
        "resident": count,
        "heartbeat": 30,
    }
    spec_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
    json.dump(spec, spec_file)
    spec_file.close()
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.page_views_client", spec_file.name],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    process.stdout.readline()  # {"resident": count}: all open
    os.unlink(spec_file.name)
    return process


def phase(
    server: Server, pages: list[dict[str, Any]], mode: str, seconds: float, **kwargs: Any
) -> dict[str, Any]:
    before = cpu_seconds(server.process.pid)
    result = run_client(server, pages, mode, seconds, **kwargs)
    result["cpu"] = cpu_seconds(server.process.pid) - before
    return result


def describe(side: str, results: list[dict[str, Any]]) -> dict[str, float]:
    done = sum(r["done"] for r in results)
    cpu = sum(r["cpu"] for r in results)
    wall = sum(r["seconds"] for r in results)
    errors: dict[str, int] = {}
    for r in results:
        for name, count in r["errors"].items():
            errors[name] = errors.get(name, 0) + count
    cpu_ms = 1000 * cpu / done if done else float("inf")
    figures = {
        "done": done,
        "wall_rate": done / wall if wall else 0.0,
        "cpu_ms": cpu_ms,
        "per_core": 1000 / cpu_ms if done else 0.0,
        "busy": cpu / wall if wall else 0.0,
        "p50": median(r["p50"] for r in results) * 1000,
        "p99": max(r["p99"] for r in results) * 1000,
        "turned_away": sum(r["turned_away"] for r in results),
    }
    say(
        f"    {side:>4}: {done} page views, {figures['wall_rate']:.1f}/s wall, server "
        f"{figures['cpu_ms']:.2f} ms CPU each (busy {figures['busy']:.0%} of a core) = "
        f"{figures['per_core']:.0f}/s per server core; latency p50 {figures['p50']:.0f} ms, "
        f"p99 {figures['p99']:.0f} ms; errors {errors or 0}, turned away {figures['turned_away']}"
    )
    return figures


def shown(viewer: Any, users: list[int]) -> dict[str, Any]:
    return {str(uid): p.as_dict() for uid, p in api.bulk_presence(users, viewer).items()}


def render_pages(pages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pages as the tags render them: what each shows (bulk_presence) and its stamp; then some
    of their users change before the sockets open (each a change the viewer may or may not
    see: the answer must tell exactly what changed for that viewer)."""
    User = get_user_model()
    rendered = []
    for page in pages:
        viewer = User.objects.get(pk=page["viewer"])
        since = stamps.mint(viewer.pk, time.time())
        rendered.append({**page, "since": since, "shown": shown(viewer, page["users"])})
    for n, page in enumerate(rendered):
        viewer, target, other = page["viewer"], page["users"][n % 20], page["users"][30 + n % 10]
        change = n % 7
        if change == 0:
            api.set_status(target, "dnd", text="changed after the page")
        elif change == 1:
            PrivacySettings.objects.update_or_create(
                user_id=target, defaults={"online_visibility": "nobody"}
            )
        elif change == 2:
            PrivacyException.objects.create(
                owner_id=target, viewer_id=viewer, setting="last_seen_visibility", allow=False
            )
        elif change == 3:
            Block.objects.create(blocker_id=target, blocked_id=viewer)
        elif change == 4:
            Contact.objects.filter(owner_id=target, contact_id=viewer).delete()
        elif change == 5:
            api.touch(other, "mobile")
    return rendered


def check_given(given: dict[str, Any], rendered: list[dict[str, Any]]) -> tuple[int, int, bool]:
    """The final check of the client's answers to the ``rendered`` pages (its result
    ``given``): (wrong, checked, passed). It passes only with every page opened and checked and
    none wrong: a page view that failed (refused, an error frame) checked nothing."""
    kept = given["kept"]
    for view in kept:
        view["shown"] = next(p["shown"] for p in rendered if p["viewer"] == view["viewer"])
    wrong, checked = check_snapshots(kept)
    passed = wrong == 0 and checked == len(rendered) and not given["errors"]
    return wrong, checked, passed


def check_snapshots(kept: list[dict[str, Any]]) -> tuple[int, int]:
    """Each page the client opened, its answer merged onto what the page showed, against
    bulk_presence for the same viewer, now."""
    User = get_user_model()
    wrong = 0
    for snapshot in kept:
        viewer = User.objects.get(pk=snapshot["viewer"])
        expected = shown(viewer, [int(uid) for uid in snapshot["shown"]])
        left_out = {uid: snapshot["shown"][uid] for uid in snapshot["unchanged"]}
        got = {**left_out, **snapshot["presences"]}
        if json.loads(json.dumps(expected)) != got:
            if not wrong:
                differ = sorted(uid for uid in expected.keys() | got.keys())
                differ = [uid for uid in differ if expected.get(uid) != got.get(uid)]
                say(
                    f"    e.g. viewer {snapshot['viewer']}, user {differ[0]}: got "
                    f"{got.get(differ[0])}, bulk_presence says {expected.get(differ[0])}"
                )
            wrong += 1
    return wrong, len(kept)


def print_profile(path: str) -> None:
    stats = pstats.Stats(path)
    stats.sort_stats("tottime")
    say("    server profile, ours saturated (event loop thread), by own time:")
    stats.print_stats(int(os.environ.get("BENCH_PAGE_VIEWS_TOP", "20")))
    stats.sort_stats("cumulative")
    stats.print_stats(30)
    # BENCH_PAGE_VIEWS_CALLERS="zadd,socket.send": who calls these (comma-separated patterns)
    for pattern in filter(None, os.environ.get("BENCH_PAGE_VIEWS_CALLERS", "").split(",")):
        stats.print_callers(pattern)


def record_with_py_spy(server: Server, path: str, seconds: float) -> subprocess.Popen[bytes]:
    """py-spy (all the server's threads, idle ones left out) for one phase; appended to."""
    return subprocess.Popen(
        [
            *(
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--pid",
                str(server.process.pid),
            ),
            *("--duration", str(int(seconds)), "--rate", "200", "--format", "raw"),
            *("--output", f"{path}.{time.monotonic_ns()}"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def print_py_spy(path: str, top: int = 25) -> None:
    """The functions of the recorded phases by own and by inclusive samples."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    kept = Path(path + ".all")
    for name in Path(path).parent.glob(Path(path).name + ".*"):
        if name == kept:
            continue
        text = name.read_text()
        with kept.open("a") as merged:  # the raw stacks, for a closer look (flamegraph.pl)
            merged.write(text)
        for line in text.splitlines():
            stack, _, count = line.rpartition(" ")
            frames = [
                f.rsplit(" (", 1)[0] + " " + f.rsplit("/", 1)[-1].split(":")[0]
                for f in stack.split(";")[1:]
            ]
            n = int(count)
            total += n
            if frames:
                own[frames[-1]] = own.get(frames[-1], 0) + n
            for frame in set(frames):
                inclusive[frame] = inclusive.get(frame, 0) + n
        name.unlink()
    say(f"    py-spy, ours saturated: {total} samples (all threads), stacks in {kept}")
    for title, table in (("own", own), ("inclusive", inclusive)):
        say(f"    by {title} time:")
        for frame, n in sorted(table.items(), key=lambda item: -item[1])[:top]:
            say(f"      {n / total:6.1%}  {frame}")


def keep_online(pages: list[dict[str, Any]], online: list[int]) -> None:
    """The targets online since the build browse on (a page request each, well within
    ONLINE_WINDOW): still online, no news, so nothing announced or stamped."""
    for pk in online:
        api.touch(pk)


def run(sizes: Sizes, report: Report) -> None:
    quick = report.quick
    targets, viewers = (300, 30) if quick else (3000, 300)
    seconds = 2.0 if quick else 8.0
    rounds = 1 if quick else 2
    rate = 10 if quick else 25
    concurrency = 16 if quick else 32
    say(
        f"\n== page_views: one server process, {viewers} viewers with pages of {PAGE} of "
        f"{targets} users; {rounds} round(s) of {seconds:.0f} s phases =="
    )
    client = raw_client()
    flush(client)
    client.close()
    cache.clear()
    pages = build_site(targets, viewers)
    online = sorted({uid for page in pages for uid in page["users"]})[::2]
    profile = pyspy = None
    if os.environ.get("BENCH_PAGE_VIEWS_PROFILE") == "py-spy":
        pyspy = tempfile.mktemp(prefix="page-views-", suffix=".txt")
    elif os.environ.get("BENCH_PAGE_VIEWS_PROFILE"):
        profile = tempfile.mktemp(prefix="page-views-", suffix=".prof")
    server = Server(profile)
    resident = None
    try:
        server.wait_ready(pages)
        resident = hold_resident(server, pages, RESIDENT)
        for mode in ("bare", "ours"):  # warm-up, not counted
            phase(server, pages, mode, seconds / 2, concurrency=concurrency)
        fixed: dict[str, list[dict[str, Any]]] = {"bare": [], "ours": []}
        saturated: dict[str, list[dict[str, Any]]] = {m: [] for m in SATURATED}
        for n in range(rounds):
            keep_online(pages, online)
            order = ("bare", "ours") if n % 2 == 0 else ("ours", "bare")
            for mode in order:
                fixed[mode].append(phase(server, pages, mode, seconds, rate=rate))
            # Reconnects last: a resumed one uses the stamps of the full phase just before it.
            sides = (*order, "full", "resume")
            last_stamps: dict[str, str] = {}
            for mode in sides:
                if profile and mode == "ours":
                    server.dump_profile()  # starts a fresh profile for this phase
                recorder = None
                if pyspy and mode == "ours":
                    recorder = record_with_py_spy(server, pyspy, seconds)
                result = phase(
                    server, pages, mode, seconds, concurrency=concurrency, stamps=last_stamps
                )
                saturated[mode].append(result)
                last_stamps = result["stamps"]
                if recorder is not None:
                    recorder.wait()
                if profile and mode == "ours":
                    server.dump_profile()
        say(f"  offered {rate}/s:")
        fixed_figures = {mode: describe(mode, fixed[mode]) for mode in ("bare", "ours")}
        say(f"  saturation ({concurrency} page views in flight):")
        sat = {mode: describe(mode, saturated[mode]) for mode in SATURATED}
        rendered = render_pages(pages[:20])
        given = run_client(server, rendered, "given", 30.0, keep=len(rendered))
    finally:
        if resident is not None:
            stop_process(resident, timeout=5)
        server.stop()
    wrong, checked, snapshots_right = check_given(given, rendered)
    unchecked = (
        ""
        if checked == len(rendered) and not given["errors"]
        else f" ({len(rendered) - checked} of {len(rendered)} not checked; page views failed: "
        f"{given['errors'] or 'none'})"
    )
    say(
        f"  snapshots as bulk_presence resolves them for the viewer: {checked - wrong} of "
        f"{checked}{unchecked}"
    )
    if profile:
        print_profile(profile)
        if keep := os.environ.get("BENCH_PAGE_VIEWS_KEEP"):
            shutil.copy(profile, keep)  # for a closer look (pstats, snakeviz)
        os.unlink(profile)
    if pyspy:
        print_py_spy(pyspy)
    ours, bare = sat["ours"]["per_core"], sat["bare"]["per_core"]
    ratio = ours / bare if bare else 0.0
    fixed_ratio = fixed_figures["bare"]["cpu_ms"] / fixed_figures["ours"]["cpu_ms"]
    say(
        f"  server CPU per page view at {rate}/s: ours {fixed_figures['ours']['cpu_ms']:.2f} ms, "
        f"bare {fixed_figures['bare']['cpu_ms']:.2f} ms (ratio {fixed_ratio:.2f}); wall rate at "
        f"saturation: ours {sat['ours']['wall_rate']:.1f}/s, bare {sat['bare']['wall_rate']:.1f}/s"
    )
    report.add(
        NAME,
        "server CPU per page view, ours / bare (saturated)",
        f"{sat['ours']['cpu_ms']:.2f} / {sat['bare']['cpu_ms']:.2f} ms",
    )
    report.add(
        NAME,
        "page views/s per server core, ours / bare",
        f"{ratio:.2f}",
        "≥ 0.5",
        None if quick else ratio >= 0.5,
    )
    report.add(
        NAME,
        "snapshots not as bulk_presence resolves them",
        f"{wrong} of {checked}{unchecked}",
        f"0, all {len(rendered)} checked",
        None if quick else snapshots_right,
    )

    def per_view(mode: str, key: str) -> float:
        return sum(r[key] for r in saturated[mode]) / max(1, sat[mode]["done"])

    say(
        f"  reconnects: full snapshot {sat['full']['cpu_ms']:.2f} ms CPU, "
        f"{per_view('full', 'frames'):.2f} frames ({per_view('full', 'bytes'):.0f} bytes) each; "
        f"resumed {sat['resume']['cpu_ms']:.2f} ms CPU, {per_view('resume', 'frames'):.2f} "
        f"frames ({per_view('resume', 'bytes'):.0f} bytes) each (bare "
        f"{sat['bare']['cpu_ms']:.2f} ms); unstamped page views/s per core ratio "
        f"{sat['full']['per_core'] / bare if bare else 0.0:.2f}"
    )
    report.add(
        NAME,
        "server CPU per reconnect, resumed / full snapshot",
        f"{sat['resume']['cpu_ms']:.2f} / {sat['full']['cpu_ms']:.2f} ms",
    )
    report.add(
        NAME,
        "page views/s per server core at an offered rate, ours / bare",
        f"{fixed_ratio:.2f}",
        "≥ 0.7",
        None if quick else fixed_ratio >= 0.7,
    )
    say(f"page_views: ours {ours:.0f}/s, bare {bare:.0f}/s, ratio {ratio:.2f}")

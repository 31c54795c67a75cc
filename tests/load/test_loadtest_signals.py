"""The load test's count of presence's signals (tools/loadtest/signals.py): from the servers'
logs, each user's (and each user's in each room) signals must alternate and end with the end;
a restart of presence's Redis (empty) explains its own patterns around its window, and no
other fault."""

from __future__ import annotations

from pathlib import Path

from tools.loadtest import signals

#: a restart of presence's Redis (empty): its window, and the slack around it (seconds)
RESTART = (1000.0, 1002.0)
SLACK = 12.0


def logs(directory: Path, *processes: str) -> Path:
    """Each process's log, its lines ``kind key at`` (the pid added)."""
    for pid, lines in enumerate(processes, start=1):
        text = "".join(f"{line} {pid}\n" for line in lines.strip().splitlines())
        (directory / f"{pid}.log").write_text(text)
    return directory


def checked(directory: Path, restarts: list[tuple[float, float]]) -> signals.SignalCheck:
    return signals.check(directory, restarts, slack=SLACK)


def test_alternating_signals_that_end_with_the_end_pass(tmp_path: Path) -> None:
    logs(tmp_path, "online 5 100\noffline 5 110\nentered 6@lobby:big 100", "left 6@lobby:big 120")
    result = checked(tmp_path, [])
    assert not result.failed
    assert (result.online, result.offline, result.entered, result.left) == (1, 1, 1, 1)
    assert (result.users, result.stays, result.processes) == (1, 1, 2)


def test_a_doubled_signal_fails_even_with_a_restart_around_it(tmp_path: Path) -> None:
    # The same user_offline (and room_left) sent by two processes in one second.
    logs(
        tmp_path,
        "online 5 995\noffline 5 1001\nentered 6@lobby:big 995\nleft 6@lobby:big 1001",
        "offline 5 1001\nleft 6@lobby:big 1001",
    )
    for restarts in ([], [RESTART]):
        result = checked(tmp_path, restarts)
        assert result.failed
        assert sorted(result.doubled) == [
            "5: online offline offline",
            "6@lobby:big: entered left left",
        ]
        assert result.explained == []


def test_a_start_sent_again_across_a_restart_is_explained(tmp_path: Path) -> None:
    # Online (and in a room) before the restart, recorded again after it, without the end
    # between: what a restart of presence's Redis does to users still connected.
    logs(
        tmp_path,
        "online 5 900\nonline 5 1004\noffline 5 1100",
        "entered 6@lobby:big 900\nentered 6@lobby:big 1004\nleft 6@lobby:big 1100",
    )
    result = checked(tmp_path, [RESTART])
    assert not result.failed
    assert sorted(result.explained) == [
        "5: online online offline",
        "6@lobby:big: entered entered left",
    ]
    assert "2 more with a start sent again" in signals.report(result)
    # Without the restart it is a lost user_offline and room_left.
    assert len(checked(tmp_path, []).lost) == 2


def test_an_end_missing_after_a_restart_is_explained(tmp_path: Path) -> None:
    # Left while presence's Redis was empty: no user_offline, no room_left.
    logs(tmp_path, "online 5 900\noffline 5 950\nonline 5 990", "entered 6@lobby:big 999")
    result = checked(tmp_path, [RESTART])
    assert not result.failed
    assert len(result.explained) == 2


def test_a_restart_explains_nothing_far_from_its_window(tmp_path: Path) -> None:
    logs(
        tmp_path,
        # a start sent again long after the restart
        "online 5 1100\nonline 5 1200\noffline 5 1300",
        # an end missing with the last start long after it
        "online 7 1100",
        # a start sent again whose first start came long after it
        "entered 6@lobby:big 1050\nentered 6@lobby:big 1060\nleft 6@lobby:big 1070",
    )
    result = checked(tmp_path, [RESTART])
    assert result.failed
    assert sorted(result.lost) == [
        "5: online online offline",
        "6@lobby:big: entered entered left",
        "7: online",
    ]
    assert result.explained == []


def test_a_restart_never_explains_a_lost_start(tmp_path: Path) -> None:
    # An end first, or an end twice: a user_online (room_entered) missing, which a restart
    # does not make (a user still connected is sent user_online again).
    logs(
        tmp_path,
        "offline 5 1001\nonline 5 1003\noffline 5 1010",
        "online 7 990\noffline 7 999\noffline 7 1003",
        "left 6@lobby:big 1001",
    )
    result = checked(tmp_path, [RESTART])
    assert len(result.lost) == 3
    assert result.explained == []

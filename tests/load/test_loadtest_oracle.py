"""The load test's oracle check (tools/loadtest/harness.py): which clients' views it compares,
and which it counts wrong. The clients are a generator's own (tools/loadtest/generator.py),
their views set as frames would set them; the truth is ``bulk_presence``, read as in a run."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tools.loadtest import generator as gen
from tools.loadtest import harness, oracle

pytestmark = pytest.mark.django_db(transaction=True)

#: the oracle's bound in these tests (seconds): what is still wrong then is counted
BOUND = 1.0


class OneGenerator:
    """What ``harness.Generators`` answers through the pipe, from one generator in this
    process: ``views`` of the positions asked (or of every client)."""

    def __init__(self, generator: gen.Generator, after_ask: Callable[[int], None] | None = None):
        self.generator = generator
        self.asked = 0
        self.after_ask = after_ask

    def views(self, indices: Mapping[int, list[int]] | None = None) -> list[oracle.View]:
        answer = self.generator.views(None if indices is None else indices.get(0, []))
        self.asked += 1
        if self.after_ask is not None:
            self.after_ask(self.asked)
        return answer  # type: ignore[return-value]


def population(clients: int, rooms: list[list[str]] | None = None) -> tuple[gen.Generator, Any]:
    """A generator of ``clients`` open clients, each of its own viewer with a page of the same
    two users, and an oracle over them; every client shows what bulk_presence says (right)."""
    users = [get_user_model().objects.create_user(username=f"o{n}") for n in range(clients + 2)]
    page = [users[-2].pk, users[-1].pk]
    specs = [
        gen.ClientSpec(
            index=n,
            user=users[n].pk,
            cookie="",
            page=page,
            device="web",
            server=0,
            rooms=(rooms[n] if rooms else []),
        )
        for n in range(clients)
    ]
    spec = gen.GeneratorSpec(
        number=0,
        clients=specs,
        page_viewers=[],
        ports=[1],
        hidden=set(),
        blocked_pairs=set(),
        heartbeat_interval=2,
        churn_per_second=0,
        status_per_second=0,
        idle_per_second=0,
        page_views_per_second=0,
        seed=1,
    )
    generator = gen.Generator(spec)
    pages = {c.user: page for c in specs}
    truth = harness.expected_views(pages, pages)
    for client in generator.clients:
        client.ws = object()  # type: ignore[assignment]  # an open socket
        client.view = dict(truth[client.spec.user])
    return generator, pages


def oracle_of(generators: OneGenerator, pages: dict[int, list[int]]) -> harness.Oracle:
    positions = {c.spec.index: (0, n) for n, c in enumerate(generators.generator.clients)}
    return harness.Oracle(generators, pages, positions, set(), set())  # type: ignore[arg-type]


def shows_online(client: gen.Client) -> None:
    """The client's view of its page's first user: online, which bulk_presence does not say."""
    target = client.spec.page[0]
    client.view[target] = ("online", None, ("web",), None, None, None)


def test_the_final_check_counts_a_client_whose_answer_never_came() -> None:
    generator, pages = population(3, rooms=[[], [], ["lobby:big"]])
    _right, no_snapshot, no_room_state = generator.clients
    no_snapshot.pending_snapshots = 1  # its presence_state never came
    no_room_state.room_views.reset(["lobby:big"])  # its room's room_state never came
    check = oracle_of(OneGenerator(generator), pages).check(None, bound=BOUND)
    assert check.wrong == 2
    assert check.converged_in is None
    assert check.views == 1
    assert check.first_no_view == 2
    assert sorted(check.no_view) == [1, 2]


def test_the_final_check_passes_a_client_whose_answer_came_within_the_bound() -> None:
    generator, pages = population(2)
    late = generator.clients[1]
    late.pending_snapshots = 1

    def answered(asked: int) -> None:
        late.pending_snapshots = 0  # its presence_state arrives after the first look

    check = oracle_of(OneGenerator(generator, answered), pages).check(None, bound=BOUND)
    assert check.wrong == 0
    assert check.converged_in is not None
    assert check.first_no_view == 1


@pytest.mark.parametrize("sample", [None, 1])
def test_a_wrong_view_stays_wrong_while_its_client_is_not_ready(sample: int | None) -> None:
    generator, pages = population(1)
    client = generator.clients[0]
    shows_online(client)

    def reopened(asked: int) -> None:
        # Its socket dropped after the first look and reopened; its snapshot never came.
        client.pending_snapshots = 1
        client.view = {}

    check = oracle_of(OneGenerator(generator, reopened), pages).check(sample, bound=BOUND)
    assert check.first_wrong == 1
    assert check.wrong == 1
    assert check.still_wrong == [0]
    assert check.converged_in is None


def test_a_wrong_view_leaves_once_its_client_is_back_and_agrees() -> None:
    generator, pages = population(1)
    client = generator.clients[0]
    shows_online(client)
    truth = dict(harness.expected_views(pages, [client.spec.user])[client.spec.user])

    def reloaded(asked: int) -> None:
        if asked == 1:  # not ready at the next look ...
            client.pending_snapshots = 1
        else:  # ... then its snapshot came, with the page as it is
            client.pending_snapshots = 0
            client.view = dict(truth)

    check = oracle_of(OneGenerator(generator, reloaded), pages).check(1, bound=2 * BOUND)
    assert check.first_wrong == 1
    assert check.wrong == 0
    assert check.converged_in is not None

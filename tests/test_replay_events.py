"""The engines' event queue (replay.events): one heap, typed events, a fixed order at equal times."""

import math

from replay.events import NETWORK, Ev, EventQueue


def drain(q: EventQueue, t_net: float = math.inf) -> list:
    out = []
    while (ev := q.next(t_net)) is not None:
        out.append(ev)
    return out


def test_equal_times_run_timer_reach_ready_and_push_order_within_a_kind():
    """At one instant: TIMER, then REACH, then READY, whatever the push order; two events of one
    kind in the order they were pushed; an earlier time first whatever its kind."""
    q = EventQueue()
    q.push(1.0, Ev.READY, 0, 5)
    q.push(1.0, Ev.REACH, 3, 1)
    q.push(1.0, Ev.READY, 1, 2)
    q.push(1.0, Ev.TIMER, "k", [1.0])
    q.push(0.5, Ev.READY, 9, 9)
    assert drain(q) == [(0.5, Ev.READY, 9, 9), (1.0, Ev.TIMER, "k", [1.0]), (1.0, Ev.REACH, 3, 1),
                        (1.0, Ev.READY, 0, 5), (1.0, Ev.READY, 1, 2)]
    assert len(q) == 0


def test_network_wins_ties_and_is_not_popped():
    """The network's event at t runs before a queued one at t; next() reports it without popping
    anything; a later network event lets the queue go first; nothing at all gives None."""
    q = EventQueue()
    q.push(2.0, Ev.TIMER, "k")
    assert q.next(2.0) == (2.0, NETWORK, None, None)
    assert len(q) == 1
    assert q.next(3.0) == (2.0, Ev.TIMER, "k", None)
    assert q.next(3.0) == (3.0, NETWORK, None, None)
    assert q.next(math.inf) is None


def test_payloads_are_never_compared():
    """Entries with equal time and kind differ in their counter: unorderable payloads are fine."""
    q = EventQueue()
    q.push(1.0, Ev.TIMER, {"a": 1}, object())
    q.push(1.0, Ev.TIMER, {"b": 2}, object())
    assert [e[2] for e in drain(q)] == [{"a": 1}, {"b": 2}]


def test_of_kind_and_replace_keep_the_order():
    """of_kind lists one kind earliest first; replace() with shifted entries keeps kinds and push
    order (what the steady-phase skip does to the pending events)."""
    q = EventQueue()
    q.push(2.0, Ev.READY, 0, 1)
    q.push(1.0, Ev.REACH, 0, 7)
    q.push(2.0, Ev.READY, 1, 1)
    assert [(e[0], e[3], e[4]) for e in q.of_kind(Ev.READY)] == [(2.0, 0, 1), (2.0, 1, 1)]
    q.replace([(e[0] + 10.0, *e[1:]) for e in q.heap])
    q.push(11.0, Ev.READY, 2, 0)  # pushed after the replace: after the shifted REACH at 11.0
    assert drain(q) == [(11.0, Ev.REACH, 0, 7), (11.0, Ev.READY, 2, 0), (12.0, Ev.READY, 0, 1),
                        (12.0, Ev.READY, 1, 1)]

"""Publisher confirms: every tag is settled once, by single or `multiple` acks and nacks,
in whatever grouping the broker sends them."""

from __future__ import annotations

from core.broker import Confirms


def test_single_and_multiple_acks_and_nacks_settle_each_tag_once():
    confirms = Confirms(channel=None)
    tags = [confirms.published() for _ in range(10)]
    assert tags == list(range(1, 11))

    confirms._on_ack(3, True)  # 1..3
    assert confirms.pending == set(range(4, 11))
    confirms._on_nack(5, False)
    confirms._on_ack(4, False)
    confirms._on_ack(2, True)  # a repeat below what is settled changes nothing
    assert confirms.pending == {6, 7, 8, 9, 10} and confirms.nacked == {5}
    confirms._on_nack(8, True)  # 6..8
    assert confirms.pending == {9, 10} and confirms.nacked == {5, 6, 7, 8}
    confirms._on_ack(10, True)
    assert not confirms.pending and confirms.nacked == {5, 6, 7, 8}


def test_a_large_batch_acked_in_many_multiple_acks_ends_settled():
    confirms = Confirms(channel=None)
    for _ in range(20_000):
        confirms.published()
    for tag in range(7, 20_001, 7):
        confirms._on_ack(tag, True)
    confirms._on_ack(20_000, True)
    assert not confirms.pending and not confirms.nacked

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


def test_a_confirm_channel_is_kept_between_batches_and_replaced_when_unusable(broker):
    from core.broker import broker_connection, confirm_channel

    conn = broker_connection()
    channel, confirms = confirm_channel(conn)
    confirms.nacked.add(1)  # what a batch leaves behind is not the next batch's
    again, same = confirm_channel(conn)
    assert again is channel and same is confirms and not same.nacked

    confirms.published()  # a batch abandoned before its confirms came
    fresh, fresh_confirms = confirm_channel(conn)
    assert fresh is not channel and not fresh_confirms.pending
    assert not channel.is_open

    fresh.close()  # e.g. closed by the broker
    replaced, _ = confirm_channel(conn)
    assert replaced is not fresh and replaced.is_open

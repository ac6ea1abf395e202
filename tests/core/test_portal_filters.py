"""The portal's `relative` filter: a time on the dashboard says how far away it is."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from core.templatetags.jobops_portal import relative


def test_relative_says_ago_for_the_past_and_in_for_the_future():
    now = timezone.now()
    assert relative(now - timedelta(minutes=3, seconds=30)) == "3 min 30 s ago"
    # A moment ahead: the filter reads the clock a little later, so a second less.
    assert relative(now + timedelta(minutes=30, seconds=1)) in ("in 30 min", "in 30 min 1 s")
    assert relative(now - timedelta(days=1, hours=2)) == "1 d 2 h ago"


def test_relative_of_nothing_is_a_dash():
    assert relative(None) == "—"

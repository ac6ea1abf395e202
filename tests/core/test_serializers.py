"""The API's shared serializer base: flat fields copied cheaply, each instance its own."""

from __future__ import annotations

from rest_framework import serializers

from core.api.serializers import FlatFieldsSerializer
from jobs.domain.params import SimParams


class _Body(FlatFieldsSerializer):
    name = serializers.CharField(max_length=5)
    count = serializers.IntegerField(min_value=1, max_value=3)
    tags = serializers.ListField(child=serializers.CharField(max_length=2), max_length=2)


def test_each_instance_binds_fields_of_its_own() -> None:
    first, second = _Body(data={}), _Body(data={})
    for name in ("name", "count", "tags"):
        assert first.fields[name] is not second.fields[name]
        assert first.fields[name].parent is first
        assert second.fields[name].parent is second
    # A field holding other fields is deep-copied: its child belongs to this instance.
    assert first.fields["tags"].child is not second.fields["tags"].child
    assert first.fields["tags"].child.parent is first.fields["tags"]
    # The declared prototypes are never bound.
    assert getattr(_Body._declared_fields["name"], "parent", None) is None


def test_validation_of_one_instance_leaves_the_next_untouched() -> None:
    bad = _Body(data={"name": "toolong", "count": 9, "tags": ["abc", "d", "e"]})
    assert not bad.is_valid()
    assert set(bad.errors) == {"name", "count", "tags"}
    good = _Body(data={"name": "ok", "count": 2, "tags": ["ab"]})
    assert good.is_valid(), good.errors
    assert good.validated_data == {"name": "ok", "count": 2, "tags": ["ab"]}
    # The validators the bad body tripped are still there for the next one.
    again = _Body(data={"name": "x", "count": 0, "tags": []})
    assert not again.is_valid()
    assert set(again.errors) == {"count"}


def test_a_params_schema_validates_alike_after_many_instances() -> None:
    for _ in range(3):
        ok = SimParams(data={"steps": 3})
        assert ok.is_valid(), ok.errors
        assert ok.validated_data["steps"] == 3
        refused = SimParams(data={"steps": 0, "bogus": 1})
        assert not refused.is_valid()
        assert set(refused.errors) == {"steps", "bogus"}

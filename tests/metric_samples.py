"""Reading Prometheus metrics in tests as the exporter serves them: before and after."""

from __future__ import annotations

from prometheus_client import REGISTRY


class Moved:
    """Every sample of this process' registry when made; called later with a sample's
    name and labels, how far that sample moved since (0 for one that never existed)."""

    def __init__(self) -> None:
        self.before = self.samples()

    @staticmethod
    def samples() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in REGISTRY.collect()
            for s in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        key = (name, frozenset(labels.items()))
        return self.samples().get(key, 0.0) - self.before.get(key, 0.0)

    def across(self, name: str, **labels: str) -> float:
        """How far the sum of every sample of `name` whose labels include these moved
        (PromQL's `sum(name{labels})`): for a sample with labels a test does not name."""
        wanted = frozenset(labels.items())

        def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> float:
            return sum(v for (n, found), v in samples.items() if n == name and wanted <= found)

        return total(self.samples()) - total(self.before)

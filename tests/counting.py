"""An engine that counts what its encoder takes, for the tests that the encoder runs once per source sentence."""


class CountingEngine:
    """The engine, counting the sources its encoder takes (`encoded`, each as a tuple of ids)."""

    def __init__(self, engine):
        self.engine, self.encoded = engine, []

    def encode(self, batch):
        self.encoded += [tuple(ids) for ids in batch]
        return self.engine.encode(batch)

    def __getattr__(self, name):
        return getattr(self.engine, name)

"""A Storage that records every folder it lists: tests of listing costs (sensors, pruning)."""

from lake_assets.storage import Storage


class CountingStorage(Storage):
    def __init__(self, s3=None):
        super().__init__(s3)
        self.listed: list[str] = []

    def list(self, uri):
        self.listed.append(uri)
        return super().list(uri)

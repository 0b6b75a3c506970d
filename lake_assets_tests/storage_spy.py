"""A Storage that records every folder it lists: tests of listing costs (sensors, pruning)."""

from lake_assets.storage import Storage


class CountingStorage(Storage):
    def __init__(self, s3=None):
        super().__init__(s3)
        self.listed: list[str] = []

    def list(self, uri):
        self.listed.append(uri)
        return super().list(uri)


def spy_on_every_storage(monkeypatch) -> list[tuple[str, str]]:
    """(call, uri) for every folder any Storage lists or walks and every file it looks at or
    reads from now on, whoever made the Storage."""
    touched: list[tuple[str, str]] = []
    for name in ("list", "walk_files", "exists", "read_bytes", "open_input_file"):

        def spy(self, uri, *args, _name=name, _original=getattr(Storage, name), **kwargs):  # noqa: B008 - binds this name's method
            touched.append((_name, uri))
            return _original(self, uri, *args, **kwargs)

        monkeypatch.setattr(Storage, name, spy)
    return touched

"""Errors raised by the pure layers; each says what was wrong and where."""


class LakeAssetsError(Exception):
    """Base class for every error lake_assets raises on purpose."""


def first_line(text: str) -> str:
    """An error's message as one line: its first line that is not blank."""
    return next((line.strip() for line in text.splitlines() if line.strip()), text.strip())


class ConfigError(LakeAssetsError):
    """The feed configuration is invalid."""


class UnsafePathError(LakeAssetsError):
    """A path segment built from external input (partition key, file name) is not safe."""


class BadInputFile(LakeAssetsError):
    """A landed file cannot be used; it is quarantined with this reason."""

    def __init__(self, uri: str, reason: str):
        super().__init__(f"{uri}: {reason}")
        self.uri = uri
        self.reason = reason


class SchemaClash(LakeAssetsError):
    """Two observations of a column have types that cannot be widened into one."""

    def __init__(self, message: str, table: str | None = None, column: str | None = None):
        super().__init__(message)
        self.table = table
        self.column = column

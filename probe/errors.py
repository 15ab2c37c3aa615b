"""The exceptions a user can cause. The CLI prints their message alone and exits non-zero."""

__all__ = ["ProbeError", "ConfigError", "OutputError", "DataError", "DeviceError"]


class ProbeError(Exception):
    """Base of every error that a user's config or files can cause."""


class ConfigError(ProbeError, ValueError):
    """A config value that cannot work: the message names it and says what to type instead."""


class OutputError(ProbeError, OSError):
    """The output path cannot be written, or holds a file of another run."""


class DataError(ProbeError, FileNotFoundError):
    """A dataset's files are missing or unreadable."""


class DeviceError(ProbeError, RuntimeError):
    """The configured device is not available on this machine."""

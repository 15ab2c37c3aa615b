"""The exceptions a user can cause. The CLI prints their message alone and exits non-zero."""

__all__ = ["ProbeError", "ConfigError", "OutputError", "DataError", "DeviceError", "RunStopped"]


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


class RunStopped(ProbeError, RuntimeError):
    """SIGINT or SIGTERM stopped a run at a batch boundary; its committed rows are kept.

    ``exit_code`` is 128 + the signal number, as a shell reports a process ended by it.
    """

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

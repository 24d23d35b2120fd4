"""The one error type users see: a plain message plus a ``HINT:`` with the fix.

Every layer raises :class:`ExatrainError` (or a subclass) for bad input or a broken environment; the CLI
prints it without a traceback and exits with code 2.
"""


class ExatrainError(Exception):
    """A problem the user can fix: ``message`` says what is wrong, ``hint`` how to fix it."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\nHINT: {self.hint}"


class ConfigError(ExatrainError):
    """Invalid configuration: unknown keys, wrong types, values that do not fit together."""


class ClusterEnvError(ExatrainError):
    """Cluster environment variables that are malformed or contradict each other."""


class DataError(ExatrainError):
    """Missing, empty or unreadable training data."""


#: exit code of a rank that exatrain's hang watcher stopped (EX_PROTOCOL; exatrain's requeue code is 75):
#: launchers and the agent tell it from a crash by this number (docs/hangs.md)
EXIT_HANG = 76

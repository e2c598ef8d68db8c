"""The one exception type the CLI turns into a one-line message and exit code 2."""


class CgtraceError(Exception):
    """A problem the user can fix: the message names the file, the problem and what to do next."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

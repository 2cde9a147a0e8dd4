"""The one exception type for expected failures (bad inputs, checkpoints, configs).

The CLI prints it as a single ``dfo-payload error: ...`` line on stderr, without a traceback.
Anything else escaping is a bug and keeps its traceback.
"""


class PayloadError(Exception):
    pass


def first_line(exc: BaseException, limit: int = 160) -> str:
    """An exception's first line for a one-line message: its type's name where its message is empty (an
    IndexError here would turn one clear error into a traceback)."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__

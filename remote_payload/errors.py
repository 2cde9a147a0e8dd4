"""The one exception type for expected failures (bad inputs, checkpoints, configs).

The CLI prints it as a single ``dfo-payload error: ...`` line on stderr, without a traceback.
Anything else escaping is a bug and keeps its traceback.
"""


class PayloadError(Exception):
    pass

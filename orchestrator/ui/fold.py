"""A wide table that folds on a narrow terminal instead of squeezing columns to nothing.

rich gives every column of a table too wide for the terminal a share of what is left; a dozen figure columns at
80 characters end up zero wide, their figures gone. ``Folded`` measures the table where it is printed: when it
fits unwrapped it is printed as it is; otherwise its columns are split into several tables, each repeating the first
(key) column, the title above the first and the caption below the last, so every figure is still shown.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table


class Folded:
    """Print TABLE whole when it fits the console's width, else folded into parts that each fit."""

    def __init__(self, table: Table, key_columns: int = 1):
        self.table = table
        self.key_columns = key_columns

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if _width(console, options, self.table) <= width:
            yield self.table
            return
        keys = list(range(min(self.key_columns, len(self.table.columns))))
        parts: list[list[int]] = []
        for index in range(len(keys), len(self.table.columns)):
            if parts and _width(console, options, self._part(parts[-1] + [index], keys)) <= width:
                parts[-1].append(index)
            else:  # a column that fits nowhere gets a part of its own (rich then wraps its cells)
                parts.append([index])
        for n, columns in enumerate(parts):
            yield self._part(columns, keys, first=n == 0, last=n == len(parts) - 1)

    def _part(self, columns: list[int], keys: list[int], first: bool = False, last: bool = False) -> Table:
        t = self.table
        part = Table(title=t.title if first else None, title_justify=t.title_justify,
                     caption=t.caption if last else None, caption_justify=t.caption_justify,
                     box=t.box, show_header=t.show_header, show_lines=t.show_lines)
        chosen = [t.columns[i] for i in keys + columns]
        for column in chosen:
            part.add_column(column.header, justify=column.justify, no_wrap=column.no_wrap,
                            min_width=column.min_width, max_width=column.max_width, style=column.style)
        for row in zip(*(list(c.cells) for c in chosen), strict=True):
            part.add_row(*row)
        return part


def _width(console: Console, options: ConsoleOptions, table: Table) -> int:
    """How wide TABLE is drawn with no cell wrapped (rich squeezes a table wider than the terminal unevenly)."""
    return Measurement.get(console, options.update(width=10_000), table).maximum

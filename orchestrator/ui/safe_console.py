"""The console dfo writes to: of what it renders, only rich's own control sequences reach the terminal.

Host text goes to rich as ``Text``, never as markup, so a ``[tag]`` in it is shown, not applied. This
console then removes control characters (``host_text.clean``) from every text segment it renders: tables,
captions, progress bars, errors and log lines alike, whichever code printed them. rich's control segments
(the cursor moves of a live display) pass, and styles are written from segment styles, not from text.
"""

from __future__ import annotations

from typing import Iterable, Optional

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment

from orchestrator.core.host_text import clean, is_clean


class SafeConsole(Console):
    def render(self, renderable: RenderableType, options: Optional[ConsoleOptions] = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control is None and not is_clean(segment.text):
                segment = segment._replace(text=clean(segment.text))
            yield segment

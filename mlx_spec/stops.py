"""Stop strings over streamed text: never emit a stop string, nor a prefix of one too early."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.emitted = 0  # characters of the full text already handed out
        self.hit: str | None = None  # the stop string that ended the text

    def feed(self, text: str, final: bool = False) -> tuple[str, bool]:
        """Given the whole text so far, return (new safe segment, whether a stop string was hit)."""
        found = [(i, s) for s in self.stops if (i := text.find(s, max(0, self.emitted - len(s) + 1))) >= 0]
        if found:
            cut, self.hit = min(found)
            segment, self.emitted = text[self.emitted : cut], cut
            return segment, True
        end = len(text) if final else len(text) - self._held(text)
        segment = text[self.emitted : max(end, self.emitted)]
        self.emitted = max(end, self.emitted)
        return segment, False

    def _held(self, text: str) -> int:
        """Length of the longest suffix of text that could still grow into a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

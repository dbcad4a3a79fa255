"""Connection policy under uvicorn's h11 protocol: read deadlines, and idle sockets never crowd out requests.

uvicorn on its own keeps a socket that never sends a byte forever, resets its keep-alive timer on
every byte (so headers trickled at 1 byte / 4 s never time out), and counts idle sockets against
`limit_concurrency`, answering 503 to everyone once enough of them are open. Here:

- a request's head must arrive in full within `header_timeout` of the connection opening (or of
  the previous response), and its body within `body_timeout` of the head, or the socket is closed;
- at most `max_connections` sockets are open: one more closes the oldest idle socket (no request
  in flight); only when every socket carries a request is the newcomer turned away;
- requests in flight are bounded by the scheduler (429 past its queue), not by counting sockets,
  so uvicorn's `limit_concurrency` is off (see serve.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

BUSY = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nretry-after: 1\r\nconnection: close\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 256
    header_timeout: float = 10.0
    body_timeout: float = 60.0


def protocol_class(limits: ConnectionLimits) -> type[H11Protocol]:
    """The class to hand uvicorn as `http=`: the policy's settings as class attributes."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class GuardedH11Protocol(H11Protocol):
    limits = ConnectionLimits()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.opened, self._deadline, self._phase = time.monotonic(), None, None
        if len(self.connections) > self.limits.max_connections and not self._evict_an_idle_one():
            transport.write(BUSY)
            transport.close()
            return
        self._expect("head")

    def connection_lost(self, exc) -> None:
        self._expect(None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start a pipelined request
        if not self.transport.is_closing():
            self._expect("head")
            self._follow()

    @property
    def idle(self) -> bool:
        """No request in flight: waiting for (or receiving) a request's head."""
        return self.conn.their_state is h11.IDLE and (self.cycle is None or self.cycle.response_complete)

    def _follow(self) -> None:
        """Move the deadline along with the request: head, then body, then none while the app answers."""
        state = self.conn.their_state
        if state is h11.SEND_BODY and self._phase == "head":
            self._expect("body")
        elif state not in (h11.IDLE, h11.SEND_BODY):
            self._expect(None)

    def _expect(self, phase: str | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._phase, self._deadline = phase, None
        if phase is not None:
            timeout = self.limits.header_timeout if phase == "head" else self.limits.body_timeout
            self._deadline = self.loop.call_later(timeout, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()  # an app waiting on the body sees a disconnect

    def _evict_an_idle_one(self) -> bool:
        idle = [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol) and c.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.opened)
        oldest.transport.close()
        self.connections.discard(oldest)  # counted out now; its connection_lost follows on the loop
        return True

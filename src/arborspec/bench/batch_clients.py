"""The clients of the concurrency benchmark: a closed loop over one queue of prompts.

The first `num_prompts` prompts of the set are served by `c` clients in a closed loop over one
queue, as a load generator with a concurrency limit sends them: each client sends the next prompt
nobody has sent yet (in order) as soon as its previous request has ended (the next request joins
the batch at the decoder's next step). With prompts dealt to the clients in advance instead
(client i sending i, i + c, ...), the run's end would depend on how the prompts happen to add up
per client: a method whose requests vary more in duration (a speculative one: acceptance varies by
prompt) would spend more of the run with a client's last requests decoding alone. Arrivals:

* `burst`: every client sends its first request at time 0;
* `staggered`: client i sends its first request at i x one plain step, where one plain step is the
  median duration of a step of plain batched decoding of one request alone, measured once per
  process after the warm-up (`plain_step_s` in every record). Requests are submitted between steps,
  so an arrival during a step joins at the next one. At concurrency 1 this is the burst schedule:
  it is run only when `burst` is not.
"""

from __future__ import annotations

import time

from ..common.timing import clock
from ..engine.batch_decode import BatchDecoder, RequestHandle


def start_offsets(clients: int, arrival: str, plain_step_s: float) -> list[float]:
    """Seconds after the start at which each client sends its first request."""
    return [0.0 if arrival == "burst" else i * plain_step_s for i in range(clients)]


def closed_loop(
    decoder: BatchDecoder,
    indices: list[int],
    offsets: list[float],
    submit,
    device=None,
) -> tuple[dict[int, RequestHandle], float]:
    """Serve the prompts `indices` on `decoder` with `len(offsets)` clients drawing from one queue
    (module doc): client i sends its first request at `offsets[i]` (seconds from the start), and
    whenever one of its requests ends it sends the next prompt nobody has sent yet, in the order of
    `indices`. `submit(index)` submits prompt `index` and returns its handle. Returns the handles by
    prompt index and the wall seconds from the start to the end of the last request."""
    pending = list(indices)
    waiting = sorted(offsets)
    handles: dict[int, RequestHandle] = {}

    def send() -> None:
        if pending:
            index = pending.pop(0)
            handles[index] = submit(index)

    t0 = clock(device)
    while True:
        now = clock() - t0
        while waiting and waiting[0] <= now:
            waiting.pop(0)
            send()
        if decoder.idle:
            if not (waiting and pending):
                break
            time.sleep(max(0.0, waiting[0] - (clock() - t0)))
            continue
        for _ in decoder.step():
            send()
    return handles, clock(device) - t0

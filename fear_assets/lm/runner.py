"""The engine's one entry point: :func:`run` executes lists of
:class:`~fear_assets.lm.requests.Request`, each list against its shared prefix.

Every caller reads the model through it: the document scoring path (one list per document,
captures active in its first packed forward), the document-free choice questions (one list
per chat prefix) and the sentence surprisal (one list per rotation). Generation is batched
across lists: a list's generate requests wait in a queue that is decoded once it holds
``engine.generation_batch`` answers, and at the end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ContextManager, Iterable, Sequence

from fear_assets.lm.requests import Request, Response

if TYPE_CHECKING:
    from fear_assets.lm.engine import GenerationState, TeacherForcedEngine

#: ``hook(cache view)``: a context manager active during a list's first packed forward.
Hook = Callable[[object], ContextManager]
#: One list of requests against its shared prefix (token ids).
Batch = tuple[Sequence[int], Sequence[Request]]


def run(engine: TeacherForcedEngine, batches: Iterable[Batch], *,
        hook: Callable[[int], Hook | None] | None = None,
        after: Callable[[int, list[Response]], None] | None = None) -> list[list[Response]]:
    """Every request of every batch, batches in the order given; per batch its responses in
    request order.

    ``batches`` may be a generator (a batch is built only when it runs). ``hook(i)`` gives
    batch ``i``'s capture context (or None); ``after(i, responses)`` runs right after batch
    ``i``'s forwards, while its captures still hold what they read. A generate request's
    response is filled when its queue is decoded: by the time :func:`run` returns, never in
    ``after``."""
    out: list[list[Response]] = []
    pending: list[tuple[Response, GenerationState]] = []

    def flush():
        for (response, _), (ids, truncated) in zip(pending, engine.generate([s for _, s in pending])):
            response.generated_ids, response.truncated = tuple(ids), truncated
        pending.clear()

    for i, (prefix_ids, requests) in enumerate(batches):
        responses, states = engine.start(prefix_ids, requests, hook(i) if hook is not None else None)
        for k, state in states.items():  # the engine's order of states: the decoding order
            responses[k] = Response()
            pending.append((responses[k], state))
        out.append(responses)  # type: ignore[arg-type]  # every slot is a Response now
        if after is not None:
            after(i, responses)  # type: ignore[arg-type]
        if len(pending) >= max(1, engine.generation_batch):
            flush()
    flush()
    return out


__all__ = ["Batch", "Hook", "run"]

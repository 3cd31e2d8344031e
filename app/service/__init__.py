"""The one package of app/ that uses `mha`: models, inference off the event loop, caching, encoding.

Routes call `AttentionService` (service.py), which holds parts with one job each, composed, not inherited:
model access (model_access.py: the registry, fed by offers.py, its loads, health and the models list), the
answers' cache and flights (answers.py), the forwards (forwards.py) and the encoding threads (encoding.py),
handed over together as one `Parts` (parts.py); the views every answer of a text is built from (views.py);
and one part per route family made with them:
`attention` (attention.py), `insight`, `traces`, `effects`, `corpus`. A request's text goes to its model's
`Batcher` (batcher.py): `max_concurrency` worker threads per model, each taking every request waiting at
that moment (up to `max_batch`) into one padded forward (`model.attend_batch`) under
`torch.inference_mode()`. At most `max_queue` requests wait per model; beyond that a request gets 503 with
Retry-After at once.

The event loop only awaits: every answer is built (bodies.py, from a `Computed` view: computed.py) and
encoded in worker threads in short pieces (app/encoders.py), so the GIL, and with it the loop, is never
held for long; the largest (every head as JSON) is streamed a chunk at a time and never held whole
(flights.py `Stream`). Finished answers (the result tensor, the JSON bytes of answers of moderate size, the
gzipped compact bytes) are cached by (kind, model, text, pair, ...) under one key builder (`cache_key`),
and identical requests in flight, forwards and insight answers alike, share one computation (`Flights`).
When every client waiting for a computation has hung up, it is dropped before its forward or stopped
between layers. After large answers freed memory is handed back to the system (trim.py).

With `words` the token-level result is merged to words (`mha.analysis`) once and cached under its own key
in the same LRU; every answer (attention, head, compact, analysis, rollout, flow, compare) is then built
from that word-level view exactly as from the token-level one.

May import: `mha` (any package), app.schemas, app.registry, app.cache, app.encoders, app.errors,
app.memory and app.settings. Never app.routes.
"""

from app.service.answers import cache_key
from app.service.batcher import Batcher, Job, JobDropped, QueueFull, background
from app.service.computed import Computed
from app.service.flights import CHUNK_BYTES, STREAM_VALUES, Flights, Stream
from app.service.forwards import BATCH_CHARS, TooManyWaitingError
from app.service.offers import RANDOM_MODEL, RANDOM_SIZE, default_model
from app.service.service import AttentionService
from mha.analysis import FLOW_MAX_TOKENS

__all__ = [
    "BATCH_CHARS",
    "CHUNK_BYTES",
    "FLOW_MAX_TOKENS",
    "RANDOM_MODEL",
    "RANDOM_SIZE",
    "STREAM_VALUES",
    "AttentionService",
    "Batcher",
    "Computed",
    "Flights",
    "Job",
    "JobDropped",
    "TooManyWaitingError",
    "QueueFull",
    "Stream",
    "background",
    "cache_key",
    "default_model",
]

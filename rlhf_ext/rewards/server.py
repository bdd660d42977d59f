"""HTTP reward server speaking OpenRLHF's remote reward protocol (``rlhf-ext reward-server``).

For rollout actors on other nodes: ``--reward.remote_url http://HOST:PORT/get_reward``. OpenRLHF
POSTs ``{"query": [...], "prompts": [...], "labels": [...]}`` and reads back ``{"rewards": [...],
"scores": [...], "extra_logs": {...}}`` (``openrlhf/utils/agent.py``, ``_fetch_rewards_via_http``).

Standard library only (``http.server``), one thread per request; grading happens in the shared
:class:`~rlhf_ext.rewards.MathGrader` pool. At most ``max_pending`` requests are admitted at once,
the rest get 503 with ``Retry-After`` (OpenRLHF's client retries). Malformed requests get a 4xx
with a JSON ``{"error": ...}`` message. ``GET /health`` reports status and counters. SIGINT/SIGTERM
stop accepting, let admitted requests finish, then stop the grader.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

from .config import RewardConfig
from .openrlhf_protocol import RewardScorer, check_batch

logger = logging.getLogger(__name__)

REWARD_PATHS = ("/", "/get_reward", "/reward")


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() waits for admitted requests: graceful shutdown
    block_on_close = True
    request_queue_size = 1024
    allow_reuse_address = True


class RewardServer:
    """The reward service; ``port=0`` picks a free port (see :attr:`url`)."""

    def __init__(self, config: Optional[RewardConfig] = None, host: str = "127.0.0.1", port: int = 5000, *,
                 max_pending: int = 1024, max_batch: int = 16384, max_body_bytes: int = 256 * 1024 * 1024):
        for name, v in (("max_pending", max_pending), ("max_batch", max_batch), ("max_body_bytes", max_body_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.scorer = RewardScorer(config)
        self.max_pending, self.max_batch, self.max_body_bytes = max_pending, max_batch, max_body_bytes
        self._slots = threading.BoundedSemaphore(max_pending)
        self._in_flight = 0
        self._served = 0
        self._rejected = 0
        self._count_lock = threading.Lock()
        self._draining = False
        self._thread: Optional[threading.Thread] = None
        self.httpd = _Server((host, port), self._handler_class())

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def health(self) -> dict:
        reward = self.scorer.reward
        grader = reward.grader if reward.uses_correctness else None
        return {"status": "draining" if self._draining else "ok", "reward": self.scorer.config.reward,
                "timeout": self.scorer.config.timeout, "workers": grader.workers if grader else 0,
                "in_flight": self._in_flight, "max_pending": self.max_pending, "served": self._served,
                "rejected": self._rejected, "grader": grader.stats() if grader else {}}

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> "RewardServer":
        """Serve in a background thread (tests, embedding); returns at once."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="rlhf-ext-reward-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def shutdown(self) -> None:
        """Stop accepting, wait for admitted requests to be answered, stop the grader. Idempotent."""
        if self._draining:
            return
        self._draining = True
        self.httpd.shutdown()  # returns when the accept loop has stopped
        self.httpd.server_close()  # joins the request threads
        self.scorer.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- requests ------------------------------------------------------------------------------

    def _handler_class(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "rlhf-ext-reward-server"
            protocol_version = "HTTP/1.0"

            def log_message(self, fmt, *args):  # per-request lines belong at debug level
                logger.debug("%s - %s", self.address_string(), fmt % args)

            def _send(self, status: int, body: dict, headers: Optional[dict] = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, headers: Optional[dict] = None) -> None:
                self._send(status, {"error": message}, headers)

            def do_GET(self):
                if self.path.split("?", 1)[0] in ("/health", "/healthz"):
                    health = server.health()
                    self._send(HTTPStatus.OK if health["status"] == "ok" else HTTPStatus.SERVICE_UNAVAILABLE, health)
                else:
                    self._error(HTTPStatus.NOT_FOUND, f"no such endpoint {self.path!r}; POST to /get_reward, "
                                                      "GET /health")

            def do_POST(self):
                if self.path.split("?", 1)[0] not in REWARD_PATHS:
                    return self._error(HTTPStatus.NOT_FOUND, f"no such endpoint {self.path!r}; POST to /get_reward")
                length = self.headers.get("Content-Length")
                if length is None:
                    return self._error(HTTPStatus.LENGTH_REQUIRED, "Content-Length header required")
                try:
                    length = int(length)
                    if length < 0:
                        raise ValueError
                except ValueError:
                    return self._error(HTTPStatus.BAD_REQUEST, f"bad Content-Length {self.headers.get('Content-Length')!r}")
                if length > server.max_body_bytes:
                    return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                       f"body of {length} bytes exceeds the limit of {server.max_body_bytes}")
                body = self.rfile.read(length)
                try:
                    payload = json.loads(body)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    return self._error(HTTPStatus.BAD_REQUEST, f"malformed JSON: {exc}")
                if not isinstance(payload, dict):
                    return self._error(HTTPStatus.BAD_REQUEST, "body must be a JSON object with 'query', 'prompts', "
                                                              f"'labels'; got a {type(payload).__name__}")
                queries = payload.get("query", payload.get("queries"))
                if queries is None:
                    return self._error(HTTPStatus.BAD_REQUEST, "missing 'query' (the list of decoded prompt+response "
                                                              "strings)")
                try:
                    queries, prompts, labels = check_batch(queries, payload.get("prompts"), payload.get("labels"))
                except ValueError as exc:
                    return self._error(HTTPStatus.BAD_REQUEST, str(exc))
                if len(queries) > server.max_batch:
                    return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                       f"{len(queries)} samples in one request exceed the limit of {server.max_batch}")
                if not server._slots.acquire(blocking=False):
                    with server._count_lock:
                        server._rejected += 1
                    return self._error(HTTPStatus.SERVICE_UNAVAILABLE,
                                       f"server busy: {server.max_pending} requests in flight; retry",
                                       {"Retry-After": "1"})
                with server._count_lock:
                    server._in_flight += 1
                try:
                    result = server.scorer.score(queries, prompts, labels)
                finally:
                    with server._count_lock:
                        server._in_flight -= 1
                        server._served += 1
                    server._slots.release()
                self._send(HTTPStatus.OK, result)

        return Handler


def serve(config: RewardConfig, host: str = "127.0.0.1", port: int = 5000, *, max_pending: int = 1024,
          on_ready: Optional[Callable[[RewardServer], None]] = None) -> None:
    """Run the server in this (main) thread until SIGINT/SIGTERM, then shut down gracefully."""
    server = RewardServer(config, host, port, max_pending=max_pending)
    stop = threading.Event()

    def request_stop(signum, frame):
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    server.start()
    server.scorer.reward.start(wait_ready=False)  # the grader's workers, if the spec grades
    try:
        if on_ready is not None:
            on_ready(server)
        while not stop.wait(0.5):
            pass
    finally:
        t0 = time.monotonic()
        logger.info("rlhf_ext reward server: stopping (finishing %d in-flight requests)", server._in_flight)
        server.shutdown()
        logger.info("rlhf_ext reward server: stopped after %.1fs", time.monotonic() - t0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_arguments(parser) -> None:
    """The flags of ``rlhf-ext reward-server``."""
    from ..ground.argtypes import port, positive_int, positive_seconds

    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind; 0.0.0.0 to serve other nodes (default: 127.0.0.1)")
    parser.add_argument("--port", type=port, default=5000,
                        help="port to bind; 0 = any free port, printed at start (default: 5000)")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="grader worker processes (default: RLHF_EXT_REWARD_WORKERS, else min(CPUs, 8))")
    parser.add_argument("--timeout", type=positive_seconds, default=None,
                        help="hard time limit per sample in seconds (default: RLHF_EXT_REWARD_TIMEOUT, else 5)")
    parser.add_argument("--reward", default=None,
                        help="weighted spec like 'accuracy:1.0,format:0.2,truncation:-0.5' or a preset: math, open_r1 "
                             "(default: RLHF_EXT_REWARD, else math)")
    parser.add_argument("--max-pending", type=positive_int, default=1024,
                        help="requests admitted at once; more get 503 + Retry-After (default: 1024)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log level (default: INFO)")


def run(args) -> int:
    """``rlhf-ext reward-server``: serve until SIGINT/SIGTERM; 2 on a bad setting, 1 when it cannot listen."""
    import dataclasses
    import sys

    from .config import reward_config_from_env

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = reward_config_from_env()
        overrides = {k: v for k, v in (("reward", args.reward), ("timeout", args.timeout),
                                       ("workers", args.workers)) if v is not None}
        config = dataclasses.replace(config, **overrides).validate()
    except ValueError as exc:
        print(f"rlhf-ext reward-server: error: {exc}", file=sys.stderr)
        return 2

    def ready(server) -> None:
        print(f"rlhf-ext reward-server: listening on {server.url} (POST /get_reward, GET /health); "
              f"reward={config.reward} timeout={config.timeout:g}s", flush=True)

    try:
        serve(config, args.host, args.port, max_pending=args.max_pending, on_ready=ready)
    except OSError as exc:
        print(f"rlhf-ext reward-server: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0

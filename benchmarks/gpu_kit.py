"""The measuring kit of ``benchmarks.gpu_stages``: a tokenizer of ids, a clock that synchronises the GPU, the timed
runs, FLOPs of a model's shape, and the random-weight models built from a config."""

from __future__ import annotations

import time
import traceback

import numpy as np
import torch


class IdTokenizer:
    """Texts of space-separated token ids ("17 5 302"), BOS 1, EOS 2, pad 0: what the scorer and the lean decoder
    ask of a tokenizer, with no vocabulary file (the GPU machine cannot download one)."""

    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, texts, add_special_tokens: bool = True, **_):
        one = isinstance(texts, str)
        start = [self.bos_token_id] if add_special_tokens else []
        ids = [start + [int(x) for x in t.split()] for t in ([texts] if one else texts)]
        return {"input_ids": ids[0] if one else ids}


class Clock:
    """Times measurements within a per-measurement budget and a limit on the whole run."""

    def __init__(self, device: str, budget: float, max_reps: int, limit: float):
        self.device, self.budget, self.max_reps, self.limit = device, budget, max_reps, limit
        self.t0 = time.perf_counter()

    def left(self) -> float:
        return self.limit - (time.perf_counter() - self.t0)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def time(self, fn, warmup: int = 1) -> tuple[float, int]:
        """(median seconds of a timed repetition, repetitions) after ``warmup`` untimed calls."""
        for _ in range(warmup):
            fn()
        self.sync()
        times, end = [], time.perf_counter() + self.budget
        while not times or (len(times) < self.max_reps and time.perf_counter() < end and self.left() > 0):
            t = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - t)
        return float(np.median(times)), len(times)


def measure(rows: list, base: dict, clock: Clock, fn, metrics, warmup: int = 1) -> None:
    """Time ``fn``; ``rows += {**base, "seconds", "reps", **metrics(seconds)}``. A skip (over the time limit) or an
    error is recorded instead, and the run goes on."""
    if clock.left() <= 0:
        rows.append({**base, "skipped": "over --time-limit"})
    else:
        try:
            sec, reps = clock.time(fn, warmup)
            rows.append({**base, "seconds": sec, "reps": reps, **metrics(sec)})
        except Exception as e:  # noqa: BLE001 (one failed measurement must not lose the others)
            traceback.print_exc()
            rows.append({**base, "error": f"{type(e).__name__}: {e}"[:500]})
            if clock.device.startswith("cuda"):
                torch.cuda.empty_cache()
    print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)


LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def profile(fn, clock: Clock, top: int = 12) -> dict:
    """One call of ``fn`` under ``torch.profiler``: its wall seconds, the seconds the device (GPU kernels; on a CPU,
    the ops' own time) was busy, the fraction, the kernel launches, and the ``top`` ops by own device time. A scorer
    bound by launches shows a low busy fraction and many launches per sequence."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = clock.device.startswith("cuda")
    acts = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    fn()  # warm-up, outside the trace
    clock.sync()
    t = time.perf_counter()
    with torch_profile(activities=acts) as prof:
        fn()
        clock.sync()
    wall = time.perf_counter() - t
    ev = prof.key_averages()

    def own(e) -> float:  # microseconds of the op's own time on the device that runs it
        if not cuda:
            return e.self_cpu_time_total
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)

    busy = sum(own(e) for e in ev) / 1e6
    launches = sum(e.count for e in ev if e.key in LAUNCHES) if cuda else None
    ops = sorted(ev, key=own, reverse=True)[:top]
    return {"wall_s": wall, "busy_s": busy, "busy_fraction": busy / wall if wall else 0.0, "launches": launches,
            "top": [{"op": e.key, "count": e.count, "own_s": own(e) / 1e6} for e in ops]}  # fmt: skip


def rate(fn, work: float, clock: Clock, seconds: float) -> float:
    """``work`` per second of ``fn`` (called in fives, for at least ``seconds``, after 3 warm-up calls)."""
    for _ in range(3):
        fn()
    clock.sync()
    reps, t = 0, time.perf_counter()
    while not reps or time.perf_counter() - t < seconds:
        for _ in range(5):
            fn()
        clock.sync()
        reps += 5
    return work * reps / (time.perf_counter() - t)


def arch(model) -> dict:
    c = model.config
    heads = getattr(c, "num_attention_heads", 1)
    return {"N": sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and "lm_head" not in n),
            "layers": c.num_hidden_layers, "qdim": heads * (getattr(c, "head_dim", None) or c.hidden_size // heads),
            "hidden": c.hidden_size, "vocab": c.vocab_size,
            "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}  # fmt: skip


def fwd_flops(a: dict, new: int, past: int = 0) -> float:
    """Matmul FLOPs of ``new`` tokens after ``past`` cached ones under a causal mask, LM head not included."""
    return 2 * a["N"] * new + 4 * a["layers"] * a["qdim"] * (new * past + new * (new + 1) / 2)


def build_lm(spec: dict, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**spec, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model.to(dtype).eval()
    # a random LM would end at random: no end-of-sequence id, every prompt gets its new tokens
    model.generation_config.eos_token_id = None
    return model


def ids_text(rng, vocab: int, lo_hi: tuple[int, int]) -> str:
    return " ".join(map(str, rng.integers(3, vocab, int(rng.integers(lo_hi[0], lo_hi[1] + 1)))))

"""The stateful step on a CUDA GPU: replayed from one CUDA graph per chunk size, shared by every stream.

Eager torch on a GPU is launch-bound: the step's hundreds of small kernels cost about the same per
call at any chunk size, several times what the step replayed from a graph costs (docs/performance.md,
"Decoder on a GPU"). A graph is bound to the addresses of its inputs and
outputs, so each one reads the step's state from one set of static buffers and writes the new
state back into them; a stream keeps its state in tensors of its own and copies it in before a
replay and out after it (a small share of a call: docs/performance.md, "Decoder on a GPU").

Float32 precision is a process-wide torch setting that kernels read when they are launched, or, in
a graph, when it is captured: `float32_precision` sets it for the duration of a capture or an eager
call and puts it back. TF32 is off unless asked for: TF32 matmuls and convolutions (cuDNN's are on
by torch's default) cut parity with the fp32 decode on the CPU by half (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from codecstream.decoder import StatefulDecoder, StatefulDecoderStep

# The flags are process-wide: one change at a time, so that two decoders cannot restore each
# other's values. Held across a capture too, because only one capture may be under way per process.
_FLAGS_LOCK = threading.RLock()


def _tf32_flags(tf32: bool) -> list[tuple[object, str, object]]:
    """(namespace, attribute, value) of the flags that switch TF32 for cuBLAS matmuls and cuDNN convolutions."""
    if hasattr(torch.backends.cudnn, "conv"):
        # A torch with the fp32_precision flags raises on reading allow_tf32 once a process set them.
        value = "tf32" if tf32 else "ieee"
        return [
            (torch.backends.cuda.matmul, "fp32_precision", value),
            (torch.backends.cudnn.conv, "fp32_precision", value),
        ]
    return [(torch.backends.cuda.matmul, "allow_tf32", tf32), (torch.backends.cudnn, "allow_tf32", tf32)]


@contextlib.contextmanager
def float32_precision(tf32: bool) -> Iterator[None]:
    """Run the block with TF32 on or off for float32 matmuls and convolutions, then restore the flags."""
    flags = _tf32_flags(tf32)
    with _FLAGS_LOCK:
        saved = [getattr(namespace, name) for namespace, name, _ in flags]
        try:
            for namespace, name, value in flags:
                setattr(namespace, name, value)
            yield
        finally:
            for (namespace, name, _), value in zip(flags, saved, strict=True):
                setattr(namespace, name, value)


class StreamState:
    """A stream's step state on the device: `position`, and every other tensor a view into one buffer,
    so that moving a whole state in or out of the graphs' static buffers is two copies."""

    @torch.inference_mode()
    def __init__(self, step: StatefulDecoderStep) -> None:
        self._initial_state = step.initial_state
        position, *rest = step.initial_state()
        self.position = position
        self.values = torch.cat([tensor.flatten() for tensor in rest])
        views, offset = [], 0
        for tensor in rest:
            views.append(self.values[offset : offset + tensor.numel()].view(tensor.shape))
            offset += tensor.numel()
        self.tensors: tuple[torch.Tensor, ...] = (position, *views)

    @property
    def nbytes(self) -> int:
        return self.position.nbytes + self.values.nbytes

    def load(self, tensors: Iterable[torch.Tensor]) -> None:
        """Copy a state given as separate tensors (`StatefulDecoderStep` order) into this one."""
        for target, value in zip(self.tensors, tensors, strict=True):
            target.copy_(value)

    def copy_(self, other: StreamState) -> None:
        self.position.copy_(other.position)
        self.values.copy_(other.values)

    @torch.inference_mode()
    def reset(self) -> None:
        self.load(self._initial_state())


@dataclasses.dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    codes: torch.Tensor  # (1, frames, Q) int64, the graph's input
    pcm: torch.Tensor  # (frames * samples_per_frame,) float32, the graph's output


class GraphedStep:
    """The step of one model on a CUDA device, captured lazily once per chunk size.

    Every stream of a decoder replays the same graphs from its own `StreamState`; replays (and
    priming, which shares one eager decoder) take a lock, since streams may decode from several
    threads. Priming stays eager: it runs the transformer alone over old context, once per stream.
    """

    def __init__(self, engine: StatefulDecoder, *, tf32: bool) -> None:
        self._engine = engine  # eager, with codes_tensor on the device
        self._step = engine.step_module
        self._num_codebooks = engine.model.config.num_quantizers
        self._tf32 = tf32
        self._lock = threading.Lock()
        self._static = StreamState(self._step)
        self._graphs: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self._capture_stream = torch.cuda.Stream()
        #: Chunk size -> seconds its capture took (including one eager warm-up run of the step).
        self.capture_seconds: dict[int, float] = {}

    def new_stream(self) -> GraphedStream:
        return GraphedStream(self, StreamState(self._step))

    def decode(self, state: StreamState, codes: np.ndarray) -> np.ndarray:
        with self._lock, torch.inference_mode():
            graph = self._graph(len(codes))
            graph.codes[0].copy_(torch.from_numpy(np.array(codes, dtype=np.int64)))
            self._static.copy_(state)
            graph.graph.replay()
            state.copy_(self._static)
            # The copy to the host waits for the replay and the state copy. Graphs share one memory
            # pool, so another size's replay may overwrite this output: it is read here, under the lock.
            return graph.pcm.cpu().numpy()

    def prime(self, state: StreamState, codes: np.ndarray) -> None:
        with self._lock, torch.inference_mode(), float32_precision(self._tf32):
            self._engine.state = state.tensors
            self._engine.prime_tensor(codes)
            state.load(self._engine.state)

    def _graph(self, frames: int) -> _Graph:
        if frames in self._graphs:
            return self._graphs[frames]
        began = time.perf_counter()
        codes = torch.zeros(1, frames, self._num_codebooks, dtype=torch.int64, device=self._static.position.device)
        inputs = self._static.tensors
        with float32_precision(self._tf32):
            # One eager run on the capture stream first: what torch sets up lazily on first use
            # (cuBLAS workspaces for the stream, cuDNN plans for the shapes) cannot happen in a capture.
            self._capture_stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self._capture_stream):
                self._step(codes, *inputs)
            torch.cuda.current_stream().wait_stream(self._capture_stream)
            graph = torch.cuda.CUDAGraph()
            stream = self._capture_stream
            # thread_local: other threads of the process may go on using the GPU during the capture.
            with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                pcm, *new_state = self._step(codes, *inputs)
                self._static.load(new_state)
                pcm = pcm[0].float()
        self._graphs[frames] = _Graph(graph, codes, pcm)
        self.capture_seconds[frames] = time.perf_counter() - began
        return self._graphs[frames]


class GraphedStream:
    """One stream of a GraphedStep: a state of its own, the shared graphs."""

    def __init__(self, step: GraphedStep, state: StreamState) -> None:
        self._step = step
        self.state = state

    def decode(self, codes: np.ndarray) -> np.ndarray:
        return self._step.decode(self.state, codes)

    def prime(self, codes: np.ndarray) -> None:
        self._step.prime(self.state, codes)

    def reset(self) -> None:
        self.state.reset()

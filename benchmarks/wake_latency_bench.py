"""How long a message takes to reach a process that has been idle: the floor under server_grpc's tails.

A chunk of C frames leaves the server C x 80 ms after the previous one, and the client sleeps in
between. This measures, on this machine, the one-way latency of a message against the idle gap
before it, for three paths:
  - a bare socketpair between two processes (no gRPC, no Python event loop in the receiver);
  - codecstream's replay server to a blocking gRPC stub (sent_at -> parsed by the client);
  - the same to codecstream's AsyncClient (grpc.aio), as server_bench measures it;
with the chunk ramp 2, 4, 8, 16, 25 (gaps of 0.16-2 s) and with 1-frame chunks (80 ms gaps), and
the major page faults of both processes during each stream (none means no code was paged back in).

    .venv/bin/python benchmarks/wake_latency_bench.py     # ~1 minute

Writes benchmarks/results/wake_latency.json.
"""

from __future__ import annotations

import asyncio
import os
import queue
import resource
import socket
import struct
import time

import grpc
from bench_record import RESULTS, machine, write_record
from codecstream.client import AsyncClient
from codecstream.protocol.decoding import FRAME_SECONDS, FRAMES_PER_SECOND
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc
from server_bench import ReplayServerProcess

GAPS_S = (0.01, 0.08, 0.16, 0.5, 1.0, 2.0)
REPEATS = 3
RAMP = (2, 4, 8, 16, 25)
FRAMES = 60  # 2 + 4 + 8 + 16 + 25 + 5: every ramp size once


def socketpair_latency() -> list[dict]:
    """Send a timestamp to a child process after each gap; the child reports when it read it."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        parent.close()
        while data := child.recv(8):
            child.send(struct.pack("d", time.time() - struct.unpack("d", data)[0]))
        os._exit(0)
    child.close()
    rows = []
    for gap in GAPS_S:
        for _ in range(REPEATS):
            time.sleep(gap)
            parent.send(struct.pack("d", time.time()))
            latency = struct.unpack("d", parent.recv(8))[0]
            rows.append({"gap_s": gap, "latency_ms": round(latency * 1000, 3)})
    parent.close()
    os.waitpid(pid, 0)
    return rows


def major_faults(pid: int) -> int:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[9])


def chunk_row(chunk_frames: int, first_frame: int, sent_at_us: int, started: float, arrived: float) -> dict:
    return {
        "frames": chunk_frames,
        "gap_before_s": round(chunk_frames * FRAME_SECONDS, 2),  # the frames it waited for
        "first_frame": first_frame,
        "sent_to_parsed_ms": round((arrived - started) * 1000 - sent_at_us / 1000, 3),
    }


def blocking_stream(target: str, chunking: tuple[int, ...]) -> list[dict]:
    with grpc.insecure_channel(target) as channel:
        stub = synthesis_pb2_grpc.SynthesisServiceStub(channel)
        requests: queue.Queue = queue.Queue()
        start = pb.SynthesizeRequest(start=pb.Start(text="wake latency"))
        start.start.chunking.first_chunk_frames = chunking[0]
        start.start.chunking.ramp_frames.extend(chunking[1:] or chunking)
        requests.put(start)
        rows, started = [], 0.0
        for response in stub.Synthesize(iter(requests.get, None)):
            arrived = time.time()
            kind = response.WhichOneof("kind")
            if kind == "header":
                started = response.header.started_at.seconds + response.header.started_at.nanos / 1e9
            elif kind == "chunk":
                chunk = response.chunk
                rows.append(chunk_row(chunk.num_frames, chunk.first_frame, chunk.sent_at_us, started, arrived))
            else:
                requests.put(None)
                break
        return rows


async def asyncio_stream(target: str, chunking: tuple[int, ...]) -> list[dict]:
    client = AsyncClient(target)
    try:
        stream = client.stream_codes("wake latency", chunking=list(chunking), resumable=False)
        header = await stream.open()
        started = header.started_at.seconds + header.started_at.nanos / 1e9
        rows = []
        async for chunk in stream:
            arrived = time.time()
            rows.append(chunk_row(chunk.num_frames, chunk.first_frame, chunk.sent_at_us, started, arrived))
        return rows
    finally:
        await client.close()


def grpc_latency() -> list[dict]:
    runs = []
    server = ReplayServerProcess(FRAMES, FRAMES_PER_SECOND, max_streams=4)
    try:
        for client in ("blocking", "asyncio"):
            for chunking in (RAMP, (1,)):
                faults = (resource.getrusage(resource.RUSAGE_SELF).ru_majflt, major_faults(server.process.pid))
                if client == "blocking":
                    chunks = blocking_stream(server.target, chunking)
                else:
                    chunks = asyncio.run(asyncio_stream(server.target, chunking))
                runs.append({
                    "client": client,
                    "chunking": list(chunking),
                    "chunks": chunks,
                    "major_faults_client": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults[0],
                    "major_faults_server": major_faults(server.process.pid) - faults[1],
                })  # fmt: skip
                latencies = [row["sent_to_parsed_ms"] for row in chunks]
                print(f"{client:8s} chunks {chunking}: sent->parsed ms {latencies[:12]}", flush=True)
    finally:
        server.close()
    return runs


def main() -> None:
    socketpair = socketpair_latency()
    for gap in GAPS_S:
        print(f"socketpair after {gap:5.2f} s idle: "
              f"{[row['latency_ms'] for row in socketpair if row['gap_s'] == gap]} ms", flush=True)  # fmt: skip
    report = {
        "benchmark": "wake_latency",
        "machine": machine(),
        "socketpair": socketpair,
        "grpc": grpc_latency(),
        "notes": [
            "sent_to_parsed_ms: client wall clock at parse minus (Header.started_at + Chunk.sent_at_us); "
            "both processes read the same clock.",
            f"gap_before_s: a chunk of C frames follows the previous one by C x {FRAME_SECONDS * 1000:g} ms "
            f"at the replay's {FRAMES_PER_SECOND:g} frames/s.",
        ],
    }
    out = RESULTS / "wake_latency.json"
    write_record(report, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

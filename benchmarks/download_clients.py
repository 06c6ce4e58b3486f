"""Decoder-download clients for the soak (issue 36): a flood of readers, and downloads abandoned
after one part. Each client is a bearer token of its own, so that the server's per-client limit
(2 downloads at once) does not simply refuse them, and each download a connection of its own.
They run in a process of their own (soak_bench's in_own_process) and put what they saw on a queue.

    directory, sha256 = random_artifact(folder, size_bytes, decoder_digest)   # what the server offers
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time

import grpc
import numpy as np
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec
from codecstream.protocol.manifest import ArtifactFile, Manifest, file_sha256, write_manifest
from codecstream.v1 import synthesis_pb2 as pb

DOWNLOAD = "/codecstream.v1.SynthesisService/DownloadDecoderArtifact"
#: The real-size decoder artifact (the 0.6B checkpoint's decoder exported to ONNX, fp32).
REAL_ARTIFACT_BYTES = 457_000_000


def random_artifact(folder: pathlib.Path, size_bytes: int, decoder_digest: str) -> tuple[pathlib.Path, str]:
    """An artifact directory for a server of `decoder_digest` whose one file is `size_bytes` random
    bytes (a server checks the manifest's codec and the file's sha256, never that it is ONNX);
    returns the directory and the file's sha256."""
    directory = folder / "artifact"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "decoder.onnx"
    rng = np.random.default_rng(0)
    with open(path, "wb") as handle:
        for start in range(0, size_bytes, 16 << 20):
            handle.write(rng.bytes(min(16 << 20, size_bytes - start)))
    entry = ArtifactFile("onnx", path.name, file_sha256(path), size_bytes, "onnxruntime", {})
    manifest = Manifest(
        codec=Manifest.codec_json(qwen3_tts_12hz_spec(decoder_digest)),
        mode="stateful",
        dtype="fp32",
        min_chunk_frames=1,
        max_chunk_frames=25,
        inputs=(),
        outputs=(),
        state=(),
        window=None,
        artifacts={"onnx": entry},
    )
    write_manifest(directory, manifest)
    return directory, entry.sha256


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def _download(channel):
    # Parts stay bytes: what is measured is the server, not this process parsing 1 MB messages.
    return channel.unary_stream(
        DOWNLOAD, request_serializer=pb.DownloadDecoderArtifactRequest.SerializeToString, response_deserializer=None
    )


def _count(outcomes: dict[str, int], status: str) -> None:
    outcomes[status] = outcomes.get(status, 0) + 1


def flood(target: str, sha256: str, tokens: list[str], seconds: float, queue) -> None:
    """Each of `tokens` downloads the whole file, again and again, as fast as it reads, for
    `seconds`; then every call still running is cut. Puts the outcomes by status, the seconds each
    download waited for its first part (a server slot), bytes received, and how many calls were
    waiting for a slot and how many receiving, sampled every 0.5 s."""
    os.nice(19)  # as the soak's attacker: the neighbours share this core
    result = {"outcomes": {}, "first_part_wait_s": [], "bytes": 0, "waiting_receiving_each_0_5_s": []}
    state: dict[int, str] = {}

    async def client(index: int, token: str) -> None:
        request = pb.DownloadDecoderArtifactRequest(sha256=sha256)
        async with grpc.aio.insecure_channel(target) as channel:
            download = _download(channel)
            while True:
                state[index], sent = "waiting", time.monotonic()
                try:
                    async for part in download(request, metadata=bearer(token)):
                        if state[index] == "waiting":
                            state[index] = "receiving"
                            result["first_part_wait_s"].append(round(time.monotonic() - sent, 3))
                        result["bytes"] += len(part)
                    _count(result["outcomes"], "complete")
                except grpc.aio.AioRpcError as error:
                    _count(result["outcomes"], error.code().name)
                except asyncio.CancelledError:
                    _count(result["outcomes"], f"cut at the end while {state[index]}")
                    raise

    async def run() -> None:
        clients = [asyncio.create_task(client(index, token)) for index, token in enumerate(tokens)]
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            values = list(state.values())
            result["waiting_receiving_each_0_5_s"].append((values.count("waiting"), values.count("receiving")))
            await asyncio.sleep(0.5)
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)

    asyncio.run(run())
    queue.put(result)


async def _abandon(target: str, token: str, sha256: str, stop_reading_s: float) -> str:
    """Start a download on a connection of its own, read its first part, then read nothing for
    `stop_reading_s` and disconnect. Returns what happened."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = _download(channel)(pb.DownloadDecoderArtifactRequest(sha256=sha256), metadata=bearer(token))
        try:
            async for _ in call:
                break
            else:
                return "ended before its first part"
        except grpc.aio.AioRpcError as error:
            return error.code().name
        if stop_reading_s:
            await asyncio.sleep(stop_reading_s)
            if call.done():
                return f"read a part, then stopped reading: the server ended it ({(await call.code()).name})"
            call.cancel()
            return f"read a part, then stopped reading {stop_reading_s:g} s and disconnected"
        call.cancel()
        return "read a part and disconnected"


def abandon_one_at_a_time(target: str, sha256: str, tokens: list[str], per_client: int, stop_s: float, queue) -> None:
    """Each of `tokens` starts `per_client` downloads one after another and abandons each after its
    first part: every other one disconnects at once, the rest stop reading for `stop_s` first."""
    outcomes: dict[str, int] = {}

    async def client(index: int, token: str) -> None:
        for round_ in range(per_client):
            stop = stop_s if (index * per_client + round_) % 2 else 0.0
            _count(outcomes, await _abandon(target, token, sha256, stop))

    async def run() -> None:
        await asyncio.gather(*(client(index, token) for index, token in enumerate(tokens)))

    started = time.monotonic()
    asyncio.run(run())
    queue.put({"outcomes": outcomes, "seconds": round(time.monotonic() - started, 1)})


def abandon_all_at_once(
    target: str, sha256: str, tokens: list[str], per_client: int, hold_s: float, probe_token: str, queue
) -> None:
    """Every token starts `per_client` downloads at once (each on its own connection); each reads
    its first part when it gets one and then reads nothing; after `hold_s` all disconnect. Beside
    them a neighbour (`probe_token`) starts one download of its own 5 s in and records when its
    first part came, if it came before the attack ended."""
    outcomes: dict[str, int] = {}
    probe: dict[str, float | str] = {}
    stopped: dict[int, grpc.aio.UnaryStreamCall] = {}

    async def held(index: int, token: str) -> str:
        async with grpc.aio.insecure_channel(target) as channel:
            call = _download(channel)(pb.DownloadDecoderArtifactRequest(sha256=sha256), metadata=bearer(token))
            try:
                async for _ in call:
                    break
                else:
                    return "ended before its first part"
            except grpc.aio.AioRpcError as error:
                return error.code().name
            stopped[index] = call
            await asyncio.sleep(3600)  # reads nothing more until the attack ends
            return "unreachable"

    async def probe_download() -> None:
        await asyncio.sleep(5.0)
        sent = time.monotonic()
        probe["outcome"] = f"no part in the {hold_s - 5:g} s the attack went on"
        async with grpc.aio.insecure_channel(target) as channel:
            call = _download(channel)(pb.DownloadDecoderArtifactRequest(sha256=sha256), metadata=bearer(probe_token))
            try:
                async for _ in call:
                    probe["first_part_s"] = round(time.monotonic() - sent, 2)
                    probe["outcome"] = "got its first part"
                    break
            except grpc.aio.AioRpcError as error:
                probe["outcome"] = error.code().name
            finally:
                call.cancel()

    async def run() -> None:
        calls = [asyncio.create_task(held(index, token)) for index, token in enumerate(tokens * per_client)]
        prober = asyncio.create_task(probe_download())
        await asyncio.sleep(hold_s)
        for index, task in enumerate(calls):
            if task.done():
                _count(outcomes, task.result())
            elif index in stopped and stopped[index].done():
                code = await stopped[index].code()
                _count(outcomes, f"read a part, then stopped reading: the server ended it ({code.name})")
            elif index in stopped:
                _count(outcomes, "read a part, then stopped reading: still held when the attack ended")
            else:
                _count(outcomes, "waiting for a slot when the attack ended")
            task.cancel()
        prober.cancel()
        await asyncio.gather(*calls, prober, return_exceptions=True)

    asyncio.run(run())
    queue.put({"outcomes": outcomes, "neighbour_download": probe})

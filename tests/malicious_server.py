"""A decoder-offering server that lies, for the client's side of the trust boundary: real gRPC on a
loopback socket that offers the manifests a test writes and answers every download with the bytes
the test chose, as many as it likes, whatever the manifest said."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import time

import grpc
from codecstream.protocol.codec_spec import qwen3_tts_12hz_spec
from codecstream.v1 import synthesis_pb2 as pb
from codecstream.v1 import synthesis_pb2_grpc

DIGEST = "sha256:" + "ab" * 32
_PART = 1 << 20


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest_json(fmt: str, file: str, data: bytes, size: int | None = None) -> str:
    """A manifest of the shape `codecstream export-decoder` writes, listing `data` as its one file."""
    codec = qwen3_tts_12hz_spec(DIGEST)
    entry = {
        "format": fmt,
        "file": file,
        "sha256": sha256(data),
        "size_bytes": len(data) if size is None else size,
        "runtime": "onnxruntime",
        "versions": {},
    }
    return json.dumps(
        {
            "manifest_version": 1,
            "codec": {field.name: getattr(codec, field.name) for field in codec.DESCRIPTOR.fields},
            "mode": "stateful",
            "dtype": "fp32",
            "chunk_frames": {"min": 1, "max": 25},
            "inputs": [],
            "outputs": [],
            "state": [],
            "window": None,
            "artifacts": {fmt: entry},
        }
    )


def relisted(manifest: dict, data: bytes) -> str:
    """An exported manifest re-pointed at this server's digest and at `data` as its ONNX file."""
    manifest = json.loads(json.dumps(manifest))
    manifest["codec"]["decoder_digest"] = DIGEST
    manifest["artifacts"] = {"onnx": {**manifest["artifacts"]["onnx"], "sha256": sha256(data), "size_bytes": len(data)}}
    return json.dumps(manifest)


class MaliciousService(synthesis_pb2_grpc.SynthesisServiceServicer):
    """Offers `manifests`; every download gets `data` from the request's offset to its end."""

    def __init__(self, manifests: list[str], data: bytes) -> None:
        self.manifests = manifests
        self.data = data
        self.downloads = 0
        #: When set, every download ends at once with this status (an artifact gone since the listing).
        self.download_status: tuple[grpc.StatusCode, str] | None = None
        #: When set, (bytes, seconds): a download sends that many bytes, then waits that long, and so on.
        self.trickle: tuple[int, float] | None = None

    def GetCodecInfo(self, request, context):
        return pb.GetCodecInfoResponse(codec=qwen3_tts_12hz_spec(DIGEST), model="malicious", server_version="0")

    def ListDecoderArtifacts(self, request, context):
        return pb.ListDecoderArtifactsResponse(artifacts=[pb.DecoderArtifact(manifest_json=m) for m in self.manifests])

    def DownloadDecoderArtifact(self, request, context):
        self.downloads += 1
        if self.download_status is not None:
            context.abort(*self.download_status)
        part, pause = self.trickle or (_PART, 0.0)
        for start in range(request.offset, len(self.data), part):
            if pause and start > request.offset:
                time.sleep(pause)
            yield pb.DownloadDecoderArtifactResponse(offset=start, data=self.data[start : start + part])


class MaliciousServer:
    def __init__(self, manifests: list[str], data: bytes) -> None:
        self.service = MaliciousService(manifests, data)
        self._server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        synthesis_pb2_grpc.add_SynthesisServiceServicer_to_server(self.service, self._server)
        self.target = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def close(self) -> None:
        self._server.stop(0)

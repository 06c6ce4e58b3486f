"""The SynthesisService registered with gRPC, with message parsing that cannot fail a call.

With the generated registration a message that does not parse (a proto3 string that is not
UTF-8, as grpc-js sends a lone surrogate) fails inside gRPC and the client sees UNKNOWN. Here it
parses to an `UnreadableMessage`, which the service answers with INVALID_ARGUMENT.
"""

from __future__ import annotations

import dataclasses

import grpc
from codecstream.v1 import synthesis_pb2 as pb
from google.protobuf.message import DecodeError

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SynthesisService"].full_name


@dataclasses.dataclass(frozen=True)
class UnreadableMessage:
    """Bytes that are not a valid message of the expected type."""

    type_name: str

    @property
    def reason(self) -> str:
        return f"a message could not be parsed as {self.type_name} (string fields must be valid UTF-8)"


def _tolerant(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError:
            return UnreadableMessage(message_class.DESCRIPTOR.full_name)

    return parse


def synthesis_handler(servicer) -> grpc.GenericRpcHandler:
    """The codecstream.v1.SynthesisService methods of `servicer` as one gRPC handler."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "Synthesize": grpc.stream_stream_rpc_method_handler(
                servicer.Synthesize,
                request_deserializer=_tolerant(pb.SynthesizeRequest),
                response_serializer=pb.SynthesizeResponse.SerializeToString,
            ),
            "GetCodecInfo": grpc.unary_unary_rpc_method_handler(
                servicer.GetCodecInfo,
                request_deserializer=_tolerant(pb.GetCodecInfoRequest),
                response_serializer=pb.GetCodecInfoResponse.SerializeToString,
            ),
            "ListVoices": grpc.unary_unary_rpc_method_handler(
                servicer.ListVoices,
                request_deserializer=_tolerant(pb.ListVoicesRequest),
                response_serializer=pb.ListVoicesResponse.SerializeToString,
            ),
            "ListDecoderArtifacts": grpc.unary_unary_rpc_method_handler(
                servicer.ListDecoderArtifacts,
                request_deserializer=_tolerant(pb.ListDecoderArtifactsRequest),
                response_serializer=pb.ListDecoderArtifactsResponse.SerializeToString,
            ),
            "DownloadDecoderArtifact": grpc.unary_stream_rpc_method_handler(
                servicer.DownloadDecoderArtifact,
                request_deserializer=_tolerant(pb.DownloadDecoderArtifactRequest),
                response_serializer=pb.DownloadDecoderArtifactResponse.SerializeToString,
            ),
        },
    )

"""The SynthesisService registered with gRPC, with message parsing that cannot fail a call.

With the generated registration a message that does not parse (a proto3 string that is not
UTF-8, as grpc-js sends a lone surrogate) fails inside gRPC and the client sees UNKNOWN. Here it
parses to an `UnreadableMessage` saying why (the string field that is not UTF-8, or the byte where
the wire format breaks), which the service answers with INVALID_ARGUMENT.
"""

from __future__ import annotations

import dataclasses

import grpc
from codecstream.v1 import synthesis_pb2 as pb
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SynthesisService"].full_name


@dataclasses.dataclass(frozen=True)
class UnreadableMessage:
    """Bytes that are not a valid message of the expected type, and why (wire_problem)."""

    type_name: str
    why: str

    @property
    def reason(self) -> str:
        return f"a message could not be parsed as {self.type_name}: {self.why}"


def _tolerant(message_class):
    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError:
            descriptor = message_class.DESCRIPTOR
            return UnreadableMessage(descriptor.full_name, wire_problem(data, descriptor) or "it does not parse")

    return parse


_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5


def wire_problem(data: bytes, descriptor: Descriptor, start: int = 0, path: str = "") -> str | None:
    """What makes `data` no message of `descriptor`, in words: the byte where the wire format breaks,
    or the string field (by its name, never its content) that is not UTF-8; None if neither."""
    position, end = 0, len(data)

    def varint() -> int | None:
        nonlocal position
        value = 0
        for shift in range(0, 64, 7):
            if position >= end:
                return None
            byte = data[position]
            position += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
        return None

    while position < end:
        at = start + position
        tag = varint()
        if tag is None or tag >> 3 == 0:
            return f"the field at byte {at} is cut short" if tag is None else f"the field at byte {at} has number 0"
        wire_type = tag & 7
        if wire_type == _VARINT:
            if varint() is None:
                return f"the field at byte {at} is cut short"
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4
            if position > end:
                return f"the field at byte {at} is cut short"
        elif wire_type == _LENGTH_DELIMITED:
            length = varint()
            if length is None or position + length > end:
                return f"the field at byte {at} is cut short"
            payload_start, position = position, position + length
            field = descriptor.fields_by_number.get(tag >> 3)
            if field is None:
                continue
            payload = data[payload_start:position]
            if field.type == FieldDescriptor.TYPE_STRING:
                try:
                    payload.decode("utf-8")
                except UnicodeDecodeError:
                    return f"{path}{field.name} is not valid UTF-8"
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                problem = wire_problem(payload, field.message_type, start + payload_start, f"{path}{field.name}.")
                if problem:
                    return problem
        else:
            return f"the field at byte {at} has wire type {wire_type}, which protobuf does not have"
    return None


def _serialized_or(message_class):
    """A serializer that passes bytes through: a handler may serialize a large message in a thread."""

    def serialize(message) -> bytes:
        return message if isinstance(message, bytes) else message_class.SerializeToString(message)

    return serialize


#: gRPC's handler for a method by (whether the client streams, whether the server streams).
_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def synthesis_handler(servicer) -> grpc.GenericRpcHandler:
    """Every method of the contract's SynthesisService, answered by the method of `servicer` that
    has its name: the table comes from the .proto, so a method added there is registered here."""
    service = pb.DESCRIPTOR.services_by_name["SynthesisService"]
    handlers = {}
    for method in service.methods:
        kind = _HANDLER_KINDS[method.client_streaming, method.server_streaming]
        handlers[method.name] = kind(
            getattr(servicer, method.name),
            request_deserializer=_tolerant(GetMessageClass(method.input_type)),
            response_serializer=_serialized_or(GetMessageClass(method.output_type)),
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)

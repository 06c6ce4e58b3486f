"""Puts codecstream's fused operations (openvino_extension) into an OpenVINO model of the decoder.

The exported graph keeps standard ONNX operators, so that every runtime reads it; SnakeBeta
(`codecstream.decoder.layers.SnakeBeta`, x + inv_beta * sin(alpha * x)^2 per channel) is there as

    Add(x, Multiply(inv_beta, Multiply(s, s)))  with  s = Sin(Multiply(x, alpha))

(either operand order; alpha and inv_beta constants of one value per channel, and the same
constant when their values are equal). Each such subgraph becomes one `codecstream.SnakeBeta`.
"""

from __future__ import annotations

import re

FUSED_OP = "SnakeBeta"
#: The fused nodes' names, by which `fused_count` finds them again in a compiled program.
FUSED_NAME_PREFIX = "codecstream.SnakeBeta."
_FUSED_NAME = re.compile(re.escape(FUSED_NAME_PREFIX) + r"\d+")


def fuse_snake_beta(model, library) -> int:
    """Replace every SnakeBeta subgraph of `model` in place; returns how many were replaced."""
    from openvino.utils.node_factory import NodeFactory

    factory = NodeFactory()
    factory.add_extension(str(library))
    fused = 0
    for sine in [node for node in model.get_ordered_ops() if node.get_type_name() == "Sin"]:
        match = _snake_beta(sine)
        if match is None:
            continue
        add, x, alpha, inv_beta = match
        node = factory.create(FUSED_OP, [x, alpha, inv_beta], {})
        node.set_friendly_name(f"{FUSED_NAME_PREFIX}{fused}")
        add.output(0).replace(node.output(0))
        fused += 1
    return fused


def fused_count(compiled) -> int:
    """How many fused SnakeBeta nodes a compiled (or imported) program runs."""
    nodes = compiled.get_runtime_model().get_ordered_ops()
    # Exactly the names given: reorders next to a fused node are named after it plus a suffix.
    return sum(_FUSED_NAME.fullmatch(node.get_friendly_name()) is not None for node in nodes)


def _snake_beta(sine):
    """(the final Add, x, alpha, inv_beta) of the SnakeBeta this Sin belongs to, or None."""
    scaled = sine.input_value(0).get_node()
    if scaled.get_type_name() != "Multiply":
        return None
    x, alpha = _split_constant(scaled)
    if x is None or not _per_channel(alpha, x):
        return None
    square = [target.get_node() for target in sine.output(0).get_target_inputs()]
    # Multiply(s, s): the Sin's only reader, reading it twice.
    if len(square) != 2 or _key(square[0]) != _key(square[1]) or square[0].get_type_name() != "Multiply":
        return None
    scaled_square = _only_consumer(square[0], "Multiply")
    if scaled_square is None:
        return None
    rest, inv_beta = _split_constant(scaled_square)
    if rest is None or _key(rest.get_node()) != _key(square[0]) or not _per_channel(inv_beta, x):
        return None
    add = _only_consumer(scaled_square, "Add")
    if add is None:
        return None
    operands = sorted(_output_key(value) for value in add.input_values())
    if operands != sorted([_output_key(x), _output_key(scaled_square.output(0))]):
        return None
    return add, x, alpha, inv_beta


def _split_constant(node):
    """(the non-constant input, the constant input) of a two-input node, or (None, None)."""
    first, second = node.input_values()
    if second.get_node().get_type_name() == "Constant" and first.get_node().get_type_name() != "Constant":
        return first, second
    if first.get_node().get_type_name() == "Constant" and second.get_node().get_type_name() != "Constant":
        return second, first
    return None, None


def _per_channel(constant, x) -> bool:
    """A float32 constant of shape (C, 1) or (1, C, 1) against a float32 x of (batch, C, time):
    one value per channel (a (C,) constant would broadcast along time instead)."""
    shape = x.get_partial_shape()
    if not (shape.rank.is_static and shape.rank.get_length() == 3 and shape[1].is_static):
        return False
    channels = shape[1].get_length()
    return (
        x.get_element_type().get_type_name() == "f32"
        and constant.get_element_type().get_type_name() == "f32"
        and list(constant.get_shape()) in ([channels, 1], [1, channels, 1])
    )


def _only_consumer(node, kind: str):
    targets = list(node.output(0).get_target_inputs())
    if len(targets) != 1 or targets[0].get_node().get_type_name() != kind:
        return None
    return targets[0].get_node()


def _key(node) -> str:
    return node.get_name()  # unique in a model; the Python wrappers are new objects on each call


def _output_key(value) -> tuple[str, int]:
    return _key(value.get_node()), value.get_index()

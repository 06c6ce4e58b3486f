"""Rewrites of an OpenVINO model of the decoder before it compiles: fewer, larger operations.

The exported graph keeps standard ONNX operators, so that every runtime reads it. On OpenVINO:

- SnakeBeta (`codecstream.decoder.layers.SnakeBeta`, x + inv_beta * sin(alpha * x)^2 per channel),
  exported as

      Add(x, Multiply(inv_beta, Multiply(s, s)))  with  s = Sin(Multiply(x, alpha))

  (either operand order; alpha and inv_beta constants of one value per channel, and the same
  constant when their values are equal), becomes one `codecstream.SnakeBeta` (openvino_extension).
- Matrix products of one input by constant weights (a transformer layer's q, k and v projections;
  its gate and up projections) become one product by the weights side by side, split after it:
  at one or two frames a call each is a small read of weights with a fixed cost of its own (1-2%
  of a call at C = 1-2 on an AMD EPYC Zen 4, in an interleaved A/B; outputs bit-identical).
"""

from __future__ import annotations

import re

import numpy as np

#: Changes whenever a rewrite here changes what a compiled program holds (a key of the kept programs).
REWRITES_VERSION = 2
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


def merge_parallel_matmuls(model) -> int:
    """Merge the MatMuls that multiply one output by constant 2-D weights; returns how many were merged."""
    from openvino import opset13 as ops

    groups: dict[tuple[str, int], list] = {}
    for node in model.get_ordered_ops():
        weights = node.input_value(1).get_node() if node.get_type_name() == "MatMul" else None
        attributes = node.get_attributes() if weights is not None else {}
        if weights is None or weights.get_type_name() != "Constant" or len(weights.get_output_shape(0)) != 2:
            continue
        if attributes.get("transpose_a") or attributes.get("transpose_b"):
            continue
        groups.setdefault(_output_key(node.input_value(0)), []).append((node, weights))
    merged = 0
    for members in groups.values():
        if len(members) < 2 or len({weights.get_element_type().get_type_name() for _, weights in members}) != 1:
            continue
        widths = [weights.get_output_shape(0)[1] for _, weights in members]
        side_by_side = ops.constant(np.concatenate([weights.get_data() for _, weights in members], axis=1))
        product = ops.matmul(members[0][0].input_value(0), side_by_side, False, False)
        parts = ops.variadic_split(product, ops.constant(np.int64(-1)), ops.constant(np.array(widths, np.int64)))
        for index, (node, _) in enumerate(members):
            node.output(0).replace(parts.output(index))
        merged += len(members)
    return merged


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

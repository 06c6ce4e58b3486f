"""A sampling option lives in four places that must agree: the contract's SamplingParams, the
client's StartOptions, the server's SamplingOverrides and the engine's list of settings a request
may override. One added to one of them and forgotten in another fails here."""

from __future__ import annotations

import dataclasses
import typing

from codecstream.client.requests import StartOptions
from codecstream.server.engine.talker_requests import OVERRIDABLE_SAMPLING
from codecstream.server.request import SamplingOverrides
from codecstream.v1 import synthesis_pb2 as pb


def test_every_sampling_option_reaches_the_engine_from_the_client_through_the_contract():
    contract = {field.name for field in pb.SamplingParams.DESCRIPTOR.fields}
    assert contract, "the contract's SamplingParams lists no field"
    assert set(typing.get_type_hints(StartOptions)) >= contract, "the client cannot set every sampling option"
    assert {field.name for field in dataclasses.fields(SamplingOverrides)} == contract
    assert set(OVERRIDABLE_SAMPLING) == contract

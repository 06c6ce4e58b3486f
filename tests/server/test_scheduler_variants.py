"""The talker's scheduler in both of vLLM's modes: the deploy YAML's `async_scheduling` picks the
variant, and a growing request is held until the text row its next step reads has arrived, counting
the token a step still in flight will return (scheduler.py)."""

from __future__ import annotations

import dataclasses

import pytest
from codecstream.server.engine.scheduler import TextPacedAsyncScheduler, TextPacedScheduler, scheduler_class
from codecstream.server.engine.text_feed import TEXT_FEEDS
from vllm.v1.core.sched.async_scheduler import AsyncScheduler


@dataclasses.dataclass
class RequestState:
    """The two counts of vLLM's Request the scheduler reads."""

    request_id: str
    num_output_tokens: int
    num_output_placeholders: int = 0


@pytest.fixture
def growing_request():
    request_id = "scheduler-variants-growing"
    TEXT_FEEDS.open(request_id, text_ids=3, final=False)  # 2 text rows its decode steps may read
    yield request_id
    TEXT_FEEDS.close(request_id)


def test_async_scheduling_gets_the_asynchronous_holding_scheduler():
    assert scheduler_class(async_scheduling=True) is TextPacedAsyncScheduler
    assert issubclass(TextPacedAsyncScheduler, AsyncScheduler)
    assert scheduler_class(async_scheduling=False) is TextPacedScheduler
    assert not issubclass(TextPacedScheduler, AsyncScheduler)


@pytest.mark.parametrize("scheduler", [TextPacedScheduler, TextPacedAsyncScheduler])
def test_a_step_in_flight_counts_against_the_text_that_has_arrived(scheduler, growing_request):
    # Two tokens returned: the next step reads row 2 - 1, which is there.
    assert scheduler._has_text(RequestState(growing_request, num_output_tokens=2))
    # Two returned and one still in flight: the step after it reads row 2, not yet fed.
    assert not scheduler._has_text(RequestState(growing_request, num_output_tokens=2, num_output_placeholders=1))
    TEXT_FEEDS.feed(growing_request, [42], final=False)
    assert scheduler._has_text(RequestState(growing_request, num_output_tokens=2, num_output_placeholders=1))


def test_a_request_without_a_feed_is_never_held():
    in_flight = RequestState("whole-text", num_output_tokens=500, num_output_placeholders=1)
    assert TextPacedAsyncScheduler._has_text(in_flight)

"""The operator's admin client against engines that answer badly: oversized, not JSON, not
an object, unusable settings, random bytes. Each is one clear exception, never a crash
elsewhere and never an unbounded read."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slipstream.engine import admin


class Stub:
    """An engine stand-in whose next answer the test sets."""

    def __init__(self) -> None:
        self.status = 200
        self.body = b"{}"

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=self.status, body=self.body, content_type="application/json")


async def with_stub(check: Any) -> Any:
    stub = Stub()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stub.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        return await check(stub, admin.AdminClient(f"http://127.0.0.1:{runner.addresses[0][1]}", "k"))
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("status", "body", "error", "words"), [
    (200, b"{" + b" " * (admin.MAX_ANSWER_BYTES + 10) + b"}", admin.BadAnswer, "over"),
    (502, b"x" * (admin.MAX_ANSWER_BYTES + 10), admin.BadAnswer, "over"),
    (200, b"<html>gateway</html>", admin.BadAnswer, "not JSON"),
    (200, b"[1, 2]", admin.BadAnswer, "JSON list, not an object"),
    (200, b"\xff\xfe\x00", admin.BadAnswer, "not JSON"),
    (200, b'{"long_prefill_token_threshold": "lots"}', admin.BadAnswer, "no usable setting"),
    (200, b'{"long_prefill_token_threshold": 1e400}', admin.BadAnswer, "no usable setting"),
    (200, b'{"long_prefill_token_threshold": 4096, "long_prefill_mode": "sideways"}', admin.BadAnswer,
     "no usable setting"),
    (500, b'{"error": "boom"}', admin.AdminError, "HTTP 500"),
    # found by tests/integration/test_tuning_loop_garbage.py: read as T = 0, then "set back"
    (200, b"", admin.BadAnswer, "no long_prefill_token_threshold"),
    (200, b"{}", admin.BadAnswer, "no long_prefill_token_threshold"),
    (200, b'{"status": "ok"}', admin.BadAnswer, "no long_prefill_token_threshold"),
])
def test_bad_answers_raise_one_clear_error(status: int, body: bytes, error: type[Exception], words: str) -> None:
    async def check(stub: Stub, client: admin.AdminClient) -> None:
        stub.status, stub.body = status, body
        with pytest.raises(error) as raised:
            admin.reported_setting(await client.get_server_info())
        assert words in str(raised.value)
        assert len(str(raised.value)) < 1000

    asyncio.run(with_stub(check))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(status=st.sampled_from([200, 201, 400, 401, 404, 500, 503]),
       body=st.one_of(st.binary(max_size=300),
                      st.dictionaries(st.sampled_from(["long_prefill_token_threshold", "long_prefill_mode",
                                                       "schedule_policy", "updated"]),
                                      st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                                st.text(max_size=10)), max_size=4)
                      .map(lambda d: __import__("json").dumps(d).encode())))
def test_fuzzed_answers_raise_only_the_clients_errors(status: int, body: bytes) -> None:
    async def check(stub: Stub, client: admin.AdminClient) -> None:
        stub.status, stub.body = status, body
        for call in (lambda: client.get_server_info(),
                     lambda: client.set_internal_state({"long_prefill_token_threshold": 2048})):
            try:
                answer = await call()
                admin.reported_setting(answer)
            except (admin.AdminError, admin.BadAnswer):
                pass

    asyncio.run(with_stub(check))

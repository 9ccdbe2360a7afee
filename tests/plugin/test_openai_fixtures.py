"""llm_openai / llm_async_openai: openai SDK clients for the test's server (a stand-in ``llm_server`` here,
no server is booted)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore")


def test_openai_clients_point_at_the_server(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makeconftest("""
        import sys
        from types import SimpleNamespace

        import pytest


        @pytest.fixture
        def llm_server():
            spec = SimpleNamespace(api_key="sk-standin", request_timeout_s=12.5)
            return SimpleNamespace(base_url="http://127.0.0.1:9", spec=spec, model_name="m")


        @pytest.hookimpl(trylast=True)
        def pytest_configure(config):
            assert "openai" not in sys.modules  # imported by the fixture, not at plugin import
    """)
    pytester.makepyfile("""
        import openai


        def test_sync(llm_openai):
            assert isinstance(llm_openai, openai.OpenAI)
            assert str(llm_openai.base_url) == "http://127.0.0.1:9/v1/"
            assert llm_openai.api_key == "sk-standin"
            assert llm_openai.timeout == 12.5
            assert llm_openai.max_retries == 0


        def test_async(llm_async_openai, llm_server):
            assert isinstance(llm_async_openai, openai.AsyncOpenAI)
            assert str(llm_async_openai.base_url) == "http://127.0.0.1:9/v1/"
            assert (llm_async_openai.timeout, llm_async_openai.max_retries) == (12.5, 0)
            llm_server.spec.api_key = None  # no key: the SDK still needs one


        def test_no_key(llm_server, request):
            llm_server.spec.api_key = None
            assert request.getfixturevalue("llm_openai").api_key == "EMPTY"
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)

"""A Node that goes silent (frozen, not disconnected) is declared gone by the Edge's
heartbeat timeout, and becomes ready again once it wakes (R-NODE-1, R-POOL-6)."""

from __future__ import annotations

import signal

import httpx
import pytest

from tests.support import Stack

pytestmark = pytest.mark.slow


def test_a_frozen_node_is_declared_gone_and_comes_back_when_it_wakes(tmp_path) -> None:
    providers = [{"id": "p", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1}]
    env = {"IOP_NODE_HEARTBEAT_INTERVAL_S": "0.2", "IOP_NODE_HEARTBEAT_TIMEOUT_S": "1.0"}
    with Stack(
        tmp_path, providers=providers, models=[{"id": "m", "providers": {"p": "m"}}], env=env
    ) as stack:
        node = stack.nodes[0].popen
        node.send_signal(signal.SIGSTOP)
        try:
            stack.wait_until(lambda snap: not snap["providers"][0]["online"], timeout=15)
            reply = httpx.post(
                stack.v1_url + "/chat/completions",
                headers={"Authorization": f"Bearer {stack.token}"},
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )
            assert reply.status_code == 503
            assert reply.json()["error"]["code"] == "no_available_provider"
        finally:
            node.send_signal(signal.SIGCONT)
        assert "declaring it gone" in stack.logs()
        stack.wait_online(timeout=30)
        reply = httpx.post(
            stack.v1_url + "/chat/completions",
            headers={"Authorization": f"Bearer {stack.token}"},
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert reply.status_code == 200
        stack.wait_idle()

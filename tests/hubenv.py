"""The ``hub`` fixture: a local Hub look-alike (tests/hubserver.py) in a clean environment
(conftest's ``env``: no token, online, private caches in tmp_path), for tests that open Hub repo ids."""
from __future__ import annotations

import pytest

from hubserver import HubServer


@pytest.fixture
def hub(env, monkeypatch):
    """The local Hub server in the clean environment of conftest's ``env`` fixture."""
    with HubServer(idle_timeout=120) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        yield srv

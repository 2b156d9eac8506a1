"""The ``hub`` fixture: a local Hub look-alike (tests/hubserver.py) with a clean environment
(no token, online, private cache in tmp_path), for tests that open Hub repo ids."""
from __future__ import annotations

import pytest

from hubserver import HubServer


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from huggingface_hub import constants
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "CKPT_SURGEON_PROGRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    monkeypatch.setenv("CKPT_SURGEON_CACHE", str(tmp_path / "cache"))
    with HubServer(idle_timeout=120) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        yield srv

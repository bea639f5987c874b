"""Shared fixtures and settings for the package tests."""
import pytest
from hypothesis import HealthCheck, settings

# numpy on a shared 2-core machine: timing-based deadlines would only make the suite flaky
settings.register_profile("kvlesson", deadline=None, max_examples=150,
                          suppress_health_check=[HealthCheck.too_slow])
# the contributor's quick loop (CONTRIBUTING.md), python -m pytest -m quick, tries fewer examples of each property
settings.register_profile("quick", parent=settings.get_profile("kvlesson"), max_examples=20)
settings.load_profile("kvlesson")


def pytest_configure(config):
    if config.option.markexpr == "quick":
        settings.load_profile("quick")


@pytest.fixture(scope="session")
def model():
    """SmolLM2-135M-Instruct through kvlesson.llama.load(), the path a learner takes, once per test process.

    CI points KVLESSON_CACHE_DIR at a fresh folder, so the first test to ask fetches and verifies the file too. The
    model is never changed by a test (its weights are read-only arrays), so one copy serves them all."""
    from kvlesson import llama

    return llama.load()

"""Fixtures for the tasks tests: the heavy optional-looking dependencies are real dependencies of
the project (pinned in pyproject.toml), so a failing import fails the tests instead of skipping."""

import importlib

import pytest


@pytest.fixture(scope="session")
def tf_text():
    """tensorflow_text (KerasNLP's tokenizers and packers need it; needs setuptools<81)."""
    return importlib.import_module("tensorflow_text")


@pytest.fixture(scope="session")
def tfds():
    """tensorflow_datasets with its testing helpers (needs tensorflow-metadata==1.15.0)."""
    module = importlib.import_module("tensorflow_datasets")
    importlib.import_module("tensorflow_datasets.testing")
    return module

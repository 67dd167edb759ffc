"""The browser fixture of the console tests."""

from .browser import browser  # noqa: F401

"""Shared fixtures. Fixture modules register themselves in `pytest_plugins`."""

pytest_plugins: list[str] = [
    "tests.fakes.fixtures",
    "tests.support.mariadb",
    "tests.support.engine",
    "tests.support.server",
    "tests.support.tmux",
]

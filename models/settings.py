"""taskhook's one settings class: every knob is a ``TASKHOOK_``-prefixed variable.

The defaults give the embedded setup (a SQLite file under ``./var/``), so a
fresh checkout runs with nothing configured.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TASKHOOK_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///./var/taskhook.db",
        description="SQLAlchemy URL of the task store: sqlite:///... or postgresql+psycopg://...",
    )
    sqlite_busy_timeout_ms: int = Field(
        default=5000,
        ge=0,
        description="How long a SQLite writer waits for the lock before giving up.",
    )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read from the environment once."""
    return Settings()

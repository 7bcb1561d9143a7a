"""The catch-up benchmark's baseline (``bench.catch_up``): read a hook's whole
delivery log -- list it, GET every attempt -- with one httpx client, storing
nothing. It imports httpx alone, so its peak RSS is the floor of a reader too.

``python -m bench.bare_log_read API_BASE_URL HOOK_PATH TOKEN``
"""

from __future__ import annotations

import json
import sys
from typing import Any

import httpx


def bare_read(api_base_url: str, hook: str, token: str) -> list[int]:
    """The baseline: list the whole log and GET every attempt, storing nothing."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json"}
    fetched: list[int] = []
    with httpx.Client(base_url=api_base_url, headers=headers, timeout=10) as client:
        params: dict[str, Any] = {"per_page": 100}
        while True:
            page = client.get(f"/{hook}/deliveries", params=params)
            page.raise_for_status()
            for attempt in page.json():
                one = client.get(f"/{hook}/deliveries/{attempt['id']}")
                one.raise_for_status()
                fetched.append(one.json()["id"])
            following = page.links.get("next")
            if following is None:
                return fetched
            params = {"per_page": 100, "cursor": httpx.URL(following["url"]).params["cursor"]}


if __name__ == "__main__":
    print(json.dumps({"recovered": bare_read(*sys.argv[1:4])}))

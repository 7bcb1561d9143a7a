"""A delivery's body on the console, on SQLite and PostgreSQL: the page shows
a bounded part of it, whatever its size and nesting, and the raw body is a
download of its own, with the page's access rules."""

from __future__ import annotations

import json
import time

from sqlalchemy import select, update

from models.db import session_scope
from models.tables import Delivery, utcnow
from tests.support.console import SECRET, Console
from tests.support.deliveries import fixture, github_headers

#: A page the console serves for any body stays below this.
PAGE_LIMIT = 1024 * 1024


def deep_body(depth: int, width: int) -> bytes:
    """GitHub's ``issues.opened``, carrying a list ``depth`` levels deep that
    holds ``width`` numbers: pretty-printed whole, each number is a line
    indented by the whole depth."""
    document = json.loads(fixture("github", "issues__opened"))
    text = json.dumps(document)
    nested = "[" * depth + ",".join(["1"] * width) + "]" * depth
    return (text[:-1] + ', "nested": ' + nested + "}").encode()


def send(console: Console, body: bytes, delivery: str) -> int:
    sent = github_headers("issues__opened", body, SECRET, delivery=delivery)
    answer = console.client.post("/webhooks/github/acme-github", content=body, headers=sent)
    assert answer.status_code == 202, answer.text
    with console.store.sessions() as session:
        return session.scalar(select(Delivery.id).where(Delivery.delivery_id == delivery))


def test_a_deeply_nested_large_body_renders_a_bounded_page_fast(console: Console) -> None:
    # 352 KiB, 200 levels deep: pretty-printed whole, about 70 MB of indentation.
    body = deep_body(200, 171_000)
    assert 340 * 1024 < len(body) < 360 * 1024
    delivery = send(console, body, "deep-1")
    console.sign_in("acme-member")

    started = time.monotonic()
    page = console.client.get(f"/console/deliveries/{delivery}")
    took = time.monotonic() - started

    assert page.status_code == 200
    assert len(page.content) < PAGE_LIMIT
    assert took < 3.0, took
    # What is shown is the body's start, as a tree; what is not is said, with the download.
    assert "&#34;action&#34;: &#34;opened&#34;" in page.text
    assert "[…]" in page.text
    assert "nested more than" in page.text
    assert f'href="/console/deliveries/{delivery}/body"' in page.text


def test_a_body_nested_past_pythons_recursion_limit_still_renders(console: Console) -> None:
    # json.loads gives up past about a thousand levels; the page does not.
    delivery = send(console, deep_body(10, 3), "deep-2")
    nested = b'{"action": "opened", "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with session_scope(console.store.sessions) as session:
        session.execute(update(Delivery).where(Delivery.id == delivery).values(body=nested))
    console.sign_in("acme-member")

    page = console.client.get(f"/console/deliveries/{delivery}")

    assert page.status_code == 200
    assert len(page.content) < PAGE_LIMIT
    assert "&#34;action&#34;: &#34;opened&#34;" in page.text


def test_a_long_flat_body_is_cut_with_a_note(console: Console) -> None:
    document = json.loads(fixture("github", "issues__opened"))
    document["issue"]["body"] = "<b>" * 400_000  # 1.2 MB of text a page would escape
    body = json.dumps(document).encode()
    delivery = send(console, body, "long-1")
    console.sign_in("acme-member")

    page = console.client.get(f"/console/deliveries/{delivery}")

    assert page.status_code == 200
    assert len(page.content) < PAGE_LIMIT
    assert "Shown in part" in page.text


def test_the_raw_body_downloads_byte_for_byte(console: Console) -> None:
    body = deep_body(200, 171_000)
    delivery = send(console, body, "deep-3")
    console.sign_in("acme-member")  # a member sees the page, so the body too

    answer = console.client.get(f"/console/deliveries/{delivery}/body")

    assert answer.status_code == 200
    assert answer.content == body
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["content-disposition"] == (
        f'attachment; filename="delivery-{delivery}-body.json"'
    )
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["cache-control"] == "no-store"
    # The small page links to it.
    assert (
        f"/console/deliveries/{delivery}/body"
        in console.client.get(f"/console/deliveries/{delivery}").text
    )


def test_the_download_keeps_the_pages_access_rules(console: Console) -> None:
    delivery = send(console, deep_body(3, 3), "deep-4")
    path = f"/console/deliveries/{delivery}/body"

    signed_out = console.client.get(path, follow_redirects=False)
    assert signed_out.status_code == 303
    assert signed_out.headers["location"].startswith("/console/sign-in")

    console.sign_in("globex-operator")  # another workspace's delivery: as if none
    assert console.client.get(path).status_code == 404
    assert console.client.get("/console/deliveries/999999/body").status_code == 404


def test_a_dropped_body_has_nothing_to_download(console: Console) -> None:
    delivery = send(console, deep_body(3, 3), "deep-5")
    with session_scope(console.store.sessions) as session:
        session.execute(
            update(Delivery)
            .where(Delivery.id == delivery)
            .values(body=b"", body_dropped_at=utcnow())
        )
    console.sign_in("acme-member")

    answer = console.client.get(f"/console/deliveries/{delivery}/body")

    assert answer.status_code == 404
    assert "dropped" in answer.text
    assert (
        f"/console/deliveries/{delivery}/body"
        not in console.client.get(f"/console/deliveries/{delivery}").text
    )

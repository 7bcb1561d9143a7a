"""``taskhook token``: add, list, revoke -- a token printed once, never listed."""

from __future__ import annotations

from models.tokens import authenticate
from tests.support.cli import as_json, refused, taskhook
from tests.support.stores import Store


def test_token_add_prints_the_token_once_and_list_never_shows_it(store: Store):
    store.workspace("acme")
    added = as_json(
        taskhook(
            store,
            "token",
            "add",
            "--workspace",
            "acme",
            "--role",
            "operator",
            "--name",
            "alice",
            "--json",
        )
    )
    assert added["token"].startswith("th_")
    with store.sessions() as session:
        principal = authenticate(session=session, token=added["token"])
    assert (principal.name, principal.role.value) == ("alice", "operator")

    listing = taskhook(store, "token", "list")
    assert added["token"] not in listing.stdout
    assert "alice" in listing.stdout and "operator" in listing.stdout
    (row,) = as_json(taskhook(store, "token", "list", "--json"))["tokens"]
    assert row["workspaces"] == ["acme"] and "token" not in row


def test_a_revoked_token_no_longer_authenticates(store: Store):
    store.workspace("acme")
    added = as_json(
        taskhook(store, "token", "add", "--workspace", "acme", "--name", "bob", "--json")
    )
    assert taskhook(store, "token", "revoke", str(added["id"])).exit_code == 0
    with store.sessions() as session:
        assert authenticate(session=session, token=added["token"]) is None


def test_token_mistakes_are_one_line_refusals(store: Store):
    store.workspace("acme")
    assert "nope" in refused(taskhook(store, "token", "add", "--workspace", "nope", "--name", "x"))
    # A blank --name is an invalid value: a usage error (test_an_invalid_value_is_a_usage_error...).
    assert "999" in refused(taskhook(store, "token", "revoke", "999"))
    assert (
        taskhook(
            store, "token", "add", "--workspace", "acme", "--name", "x", "--role", "admin"
        ).exit_code
        == 2
    )

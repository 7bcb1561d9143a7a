"""The fake Jira issue search (bench/fakes/jira_api.py), over a real socket.

The Jira catch-up's tests trust this server to answer as Jira does, so these check
it against Atlassian's own examples (tests/fixtures/jira_api/) and documented
behaviour: Cloud's token pages and Data Center's offset pages, the JQL it
evaluates (relative and absolute dates, the user's time zone, projects, issue
types, ORDER BY), field selection, ADF on v3, 401s, 400s, rate limits and server
errors.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.fakes.jira_api import NAVIGABLE, FakeJira

EMAIL = "ops@example.com"
API_TOKEN = "jira-api-token"
PAT = "jira-pat"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "jira_api"
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CLOUD = "/rest/api/3/search/jql"
CLOUD_V2 = "/rest/api/2/search/jql"
DATA_CENTER = "/rest/api/2/search"
BERLIN_IN_WINTER = timezone(timedelta(hours=1))  # a fixed offset: no tz database needed


@pytest.fixture
def jira() -> Iterator[FakeJira]:
    yield from FakeJira(email=EMAIL, api_token=API_TOKEN, pat=PAT, clock=lambda: NOW).serve()


@pytest.fixture
def cloud(jira: FakeJira) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=jira.base_url, auth=(EMAIL, API_TOKEN), timeout=5) as client:
        yield client


@pytest.fixture
def data_center(jira: FakeJira) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {PAT}"}
    with httpx.Client(base_url=jira.base_url, headers=headers, timeout=5) as client:
        yield client


def example(name: str) -> Any:
    return json.loads((FIXTURES / f"{name}.json").read_bytes())


def shape(value: Any) -> Any:
    """Keys (in order) and value types, all the way down."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value]
    return type(value).__name__


def outline(page: dict[str, Any]) -> Any:
    """A page's shape with each issue's fields left out: the example's fields are
    another issue's (watchers, worklogs, ...), not the ones the fake has."""
    page = copy.deepcopy(page)
    for issue in page["issues"]:
        issue["fields"] = {}
    return shape(page)


def create(jira: FakeJira, count: int, *, project: str = "PROJ") -> list[dict[str, Any]]:
    """``count`` issues a minute apart, oldest first, the newest a minute before NOW."""
    first = NOW - timedelta(minutes=count)
    return [
        jira.create_issue(
            project=project, summary=f"issue {n}", created_at=first + timedelta(minutes=n)
        )
        for n in range(count)
    ]


def keys(page: dict[str, Any]) -> list[str]:
    return [issue["key"] for issue in page["issues"]]


def search(client: httpx.Client, path: str, jql: str, **params: Any) -> dict[str, Any]:
    answer = client.get(path, params={"jql": jql, "fields": "created", **params})
    assert answer.status_code == 200, answer.text
    return answer.json()


def cloud_walk(client: httpx.Client, jql: str, max_results: int) -> list[dict[str, Any]]:
    """Every page, following each answer's nextPageToken until isLast."""
    pages = [search(client, CLOUD, jql, maxResults=max_results)]
    while not pages[-1]["isLast"]:
        token = pages[-1]["nextPageToken"]
        pages.append(search(client, CLOUD, jql, maxResults=max_results, nextPageToken=token))
    return pages


def found(client: httpx.Client, jql: str) -> list[str]:
    return keys(search(client, DATA_CENTER, jql, maxResults=1000))


# -- the recorded examples ---------------------------------------------------------------


def test_the_recorded_examples_are_the_bytes_sources_md_names():
    # SOURCES.md lists each file's sha256: a reformatted fixture fails here.
    sources = (FIXTURES / "SOURCES.md").read_text()
    listed = dict(re.findall(r"\| `([\w-]+\.json)` \| `([0-9a-f]{64})` \|", sources))
    assert set(listed) == {"search-jql.json", "search.json", "error-400.json", "error-401.json"}
    for name, digest in listed.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest


def test_a_cloud_page_has_the_shape_of_atlassians_example(jira, cloud):
    jira.create_issue(summary="Checkout is down", description="Main order flow broken")
    page = search(cloud, CLOUD, "project = PROJ", fields="*all")
    assert outline(page) == outline(example("search-jql"))


def test_a_cloud_page_before_the_last_adds_the_documented_next_page_token(jira, cloud):
    create(jira, 2)
    page = search(cloud, CLOUD, "project = PROJ", maxResults=1)
    expected = example("search-jql")
    expected["isLast"] = False
    expected["nextPageToken"] = "an opaque token"  # SearchAndReconcileResults.nextPageToken
    assert outline(page) == outline(expected)


def test_a_v2_description_has_the_examples_type(jira, cloud):
    jira.create_issue(summary="Checkout is down", description="Main order flow broken")
    [issue] = search(cloud, CLOUD_V2, "project = PROJ", fields="description")["issues"]
    [described] = example("search-jql")["issues"]
    assert shape(issue["fields"]["description"]) == shape(described["fields"]["description"])


def test_a_data_center_page_has_the_shape_of_atlassians_example(jira, data_center):
    jira.create_issue(summary="Checkout is down")
    page = search(data_center, DATA_CENTER, "project = PROJ")
    expected = example("search")
    del expected["warningMessages"]  # the example's JQL named a missing value; ours does not
    assert outline(page) == outline(expected)


def test_errors_have_the_shape_of_atlassians_examples(jira, cloud):
    refused = cloud.get(CLOUD, params={"jql": "project = NOPE"})
    unauthorised = httpx.get(f"{jira.base_url}{CLOUD}", params={"jql": "project = PROJ"})
    assert (refused.status_code, unauthorised.status_code) == (400, 401)
    assert shape(refused.json()) == shape(example("error-400"))
    assert unauthorised.json() == example("error-401")
    assert refused.headers["Content-Type"] == "application/json;charset=UTF-8"


# -- the issues ----------------------------------------------------------------------------


def test_issues_are_numbered_per_project_with_numeric_ids(jira):
    made = [jira.create_issue(project=project, summary="s") for project in ("PROJ", "OPS", "PROJ")]
    assert [issue["key"] for issue in made] == ["PROJ-1", "OPS-1", "PROJ-2"]
    assert [issue["id"] for issue in made] == ["10000", "10001", "10002"]
    assert made[0]["self"] == f"{jira.base_url}/rest/api/2/issue/10000"
    assert jira.issues() == made


def test_an_issue_is_written_as_jira_writes_it(jira, cloud):
    jira.create_issue(
        summary="Checkout is down",
        description="Main order flow broken",
        created_at=datetime(2026, 11, 30, 8, 15, 30, 123456, tzinfo=UTC),
        issue_type="Bug",
    )
    [issue] = search(cloud, CLOUD, "project = PROJ", fields="*navigable")["issues"]
    fields = issue["fields"]
    assert issue["self"] == f"{jira.base_url}/rest/api/3/issue/{issue['id']}"
    assert fields["created"] == fields["updated"] == "2026-11-30T08:15:30.123+0000"
    assert datetime.fromisoformat(fields["created"]) == datetime(
        2026, 11, 30, 8, 15, 30, 123000, tzinfo=UTC
    )
    assert fields["summary"] == "Checkout is down"
    assert (fields["issuetype"]["name"], fields["issuetype"]["id"]) == ("Bug", "10004")
    assert fields["issuetype"]["self"] == f"{jira.base_url}/rest/api/3/issuetype/10004"
    assert (fields["project"]["key"], fields["project"]["id"]) == ("PROJ", "10000")
    assert fields["status"]["name"] == "To Do"


def test_v3_gives_the_description_as_adf_and_v2_as_a_string(jira, cloud):
    text = "Checkout fails.\nSince 08:00.\n\nSee the dashboard."
    jira.create_issue(summary="Checkout is down", description=text)
    [v3] = search(cloud, CLOUD, "project = PROJ", fields="description")["issues"]
    [v2] = search(cloud, CLOUD_V2, "project = PROJ", fields="description")["issues"]
    assert v2["fields"]["description"] == text
    assert v2["self"] == f"{jira.base_url}/rest/api/2/issue/{v2['id']}"
    assert v3["fields"]["description"] == {
        "type": "doc",
        "version": 1,
        "content": [
            {
                "type": "paragraph",
                "content": [
                    {"type": "text", "text": "Checkout fails."},
                    {"type": "hardBreak"},
                    {"type": "text", "text": "Since 08:00."},
                ],
            },
            {"type": "paragraph", "content": [{"type": "text", "text": "See the dashboard."}]},
        ],
    }


def test_no_description_is_null_on_both_versions(jira, cloud, data_center):
    jira.create_issue(summary="no words")
    jira.create_issue(summary="empty words", description="")
    for path, client in ((CLOUD, cloud), (CLOUD_V2, cloud), (DATA_CENTER, data_center)):
        page = search(client, path, "project = PROJ", fields="description")
        assert [issue["fields"]["description"] for issue in page["issues"]] == [None, None]


def test_create_issue_refuses_what_jira_could_not_hold(jira):
    with pytest.raises(ValueError, match="aware"):
        jira.create_issue(summary="s", created_at=datetime(2026, 11, 30, 8, 15))
    with pytest.raises(ValueError, match="project key"):
        jira.create_issue(project="proj", summary="s")
    with pytest.raises(RuntimeError, match="start"):
        FakeJira().create_issue(summary="s")


# -- Cloud's token pages -------------------------------------------------------------------


def test_cloud_pages_follow_the_next_page_token_to_the_last(jira, cloud):
    made = [issue["key"] for issue in create(jira, 250)]
    pages = cloud_walk(cloud, "project = PROJ ORDER BY created ASC", max_results=100)
    assert [len(page["issues"]) for page in pages] == [100, 100, 50]
    assert [key for page in pages for key in keys(page)] == made  # each issue once, in order
    assert [page["isLast"] for page in pages] == [False, False, True]
    assert "nextPageToken" not in pages[-1]
    tokens = [request.query.get("nextPageToken") for request in jira.requests]
    assert tokens[0] is None and len(set(tokens[1:])) == 2
    assert not any(token.isdigit() for token in tokens[1:])  # opaque, not an offset


def test_cloud_pages_stand_still_while_issues_are_created(jira, cloud):
    older = [issue["key"] for issue in create(jira, 4)]
    jql = "project = PROJ ORDER BY created DESC"
    first = search(cloud, CLOUD, jql, maxResults=2)
    jira.create_issue(summary="newer", created_at=NOW)  # would shift an offset page
    second = search(cloud, CLOUD, jql, maxResults=2, nextPageToken=first["nextPageToken"])
    assert keys(first) + keys(second) == older[::-1]
    assert second["isLast"] is True


def test_asking_for_the_same_page_again_gives_the_same_page(jira, cloud):
    create(jira, 5)
    jql = "project = PROJ ORDER BY created ASC"
    token = search(cloud, CLOUD, jql, maxResults=2)["nextPageToken"]
    again = [search(cloud, CLOUD, jql, maxResults=2, nextPageToken=token) for _ in range(2)]
    assert again[0] == again[1]
    assert keys(again[0]) == ["PROJ-3", "PROJ-4"]


@pytest.mark.parametrize("token", ["not-a-token", "1"])
def test_a_token_jira_did_not_give_is_a_400(jira, cloud, token):
    create(jira, 3)
    answer = cloud.get(CLOUD, params={"jql": "project = PROJ", "nextPageToken": token})
    assert answer.status_code == 400
    assert answer.json() == {"errorMessages": ["Invalid format of nextPageToken"], "errors": {}}


def test_a_token_goes_only_with_its_own_query(jira, cloud):
    create(jira, 3)
    token = search(cloud, CLOUD, "project = PROJ", maxResults=1)["nextPageToken"]
    other = cloud.get(CLOUD, params={"jql": "issuetype = Bug", "nextPageToken": token})
    assert other.status_code == 400


def test_cloud_max_results_defaults_to_50_and_stops_at_100_or_the_cap(jira, cloud):
    create(jira, 120)
    assert len(search(cloud, CLOUD, "project = PROJ")["issues"]) == 50
    assert len(search(cloud, CLOUD, "project = PROJ", maxResults=500)["issues"]) == 100
    jira.page_size_cap = 2  # "API may return fewer items per page"
    capped = search(cloud, CLOUD, "project = PROJ", maxResults=10)
    assert (len(capped["issues"]), capped["isLast"]) == (2, False)


def test_an_empty_cloud_search_is_one_last_page(jira, cloud):
    jira.add_project("PROJ")
    assert search(cloud, CLOUD, "project = PROJ") == {"isLast": True, "issues": []}


# -- Data Center's offset pages ------------------------------------------------------------


def test_data_center_pages_by_start_at_over_the_total(jira, data_center):
    made = [issue["key"] for issue in create(jira, 120)]
    pages, start = [], 0
    while True:
        page = search(data_center, DATA_CENTER, "project = PROJ ORDER BY key ASC", startAt=start)
        pages.append(page)
        start += len(page["issues"])
        if start >= page["total"]:
            break
    assert [(p["startAt"], p["maxResults"], p["total"]) for p in pages] == [
        (0, 50, 120),
        (50, 50, 120),
        (100, 50, 120),
    ]
    assert [key for page in pages for key in keys(page)] == made
    assert page["expand"] == "names,schema"


def test_data_center_offsets_shift_when_issues_are_created(jira, data_center):
    create(jira, 4)
    jql = "project = PROJ ORDER BY created DESC"
    first = search(data_center, DATA_CENTER, jql, maxResults=2)
    jira.create_issue(summary="newer", created_at=NOW)
    second = search(data_center, DATA_CENTER, jql, maxResults=2, startAt=2)
    assert keys(first) == ["PROJ-4", "PROJ-3"]
    assert keys(second) == ["PROJ-3", "PROJ-2"]  # PROJ-3 again: offsets are not cursors
    assert (first["total"], second["total"]) == (4, 5)


def test_data_center_max_results_stops_at_1000_and_zero_only_counts(jira, data_center):
    create(jira, 3)
    assert search(data_center, DATA_CENTER, "project = PROJ", maxResults=5000)["maxResults"] == 1000
    counted = search(data_center, DATA_CENTER, "project = PROJ", maxResults=0)
    assert (counted["issues"], counted["total"]) == ([], 3)


def test_data_center_takes_an_empty_jql(jira, data_center):
    create(jira, 2)
    assert search(data_center, DATA_CENTER, "")["total"] == 2


@pytest.mark.parametrize(
    "param", [{"startAt": "first"}, {"maxResults": "many"}, {"maxResults": -1}]
)
def test_a_bad_page_parameter_is_a_400(jira, data_center, param):
    create(jira, 1)
    answer = data_center.get(DATA_CENTER, params={"jql": "project = PROJ", **param})
    assert answer.status_code == 400
    assert answer.json()["errors"] == {}


# -- created: relative, absolute, and in whose time zone -----------------------------------


@pytest.mark.parametrize(
    ("period", "within"),
    [
        ("-90m", timedelta(minutes=90)),
        ("-2h", timedelta(hours=2)),
        ('"-1d"', timedelta(days=1)),
        ("-1w", timedelta(weeks=1)),
        ('"-1w 2d"', timedelta(days=9)),
    ],
)
def test_a_relative_created_counts_back_from_the_fakes_now(jira, data_center, period, within):
    inside = jira.create_issue(summary="inside", created_at=NOW - within + timedelta(minutes=1))
    jira.create_issue(summary="outside", created_at=NOW - within - timedelta(minutes=1))
    assert found(data_center, f"created >= {period}") == [inside["key"]]


@pytest.mark.parametrize("date", ['"2026-11-30 08:15"', '"2026/11/30 08:15"'])
def test_an_absolute_created_is_a_minute_in_the_users_time_zone(jira, data_center, date):
    jira.create_issue(summary="before", created_at=datetime(2026, 11, 30, 8, 14, 59, tzinfo=UTC))
    at = jira.create_issue(summary="at", created_at=datetime(2026, 11, 30, 8, 15, tzinfo=UTC))
    assert found(data_center, f"created >= {date}") == [at["key"]]
    assert found(data_center, f"created < {date}") == ["PROJ-1"]


@pytest.mark.parametrize("date", ["2026-11-30", "2026/11/30", '"2026-11-30"'])
def test_a_date_alone_is_its_midnight(jira, data_center, date):
    jira.create_issue(summary="late", created_at=datetime(2026, 11, 29, 23, 59, tzinfo=UTC))
    jira.create_issue(summary="early", created_at=datetime(2026, 11, 30, 0, 0, tzinfo=UTC))
    assert found(data_center, f"created >= {date}") == ["PROJ-2"]


def test_an_absolute_date_is_read_in_the_users_time_zone_and_created_is_written_in_it():
    # The pitfall: "08:15" is 08:15 where the *searching user* lives. A caller that
    # writes UTC wall-clock time for a user in Berlin asks for an hour too late.
    created = datetime(2026, 11, 30, 7, 30, tzinfo=UTC)  # 08:30 in Berlin
    jql = 'created >= "2026-11-30 08:15"'
    answers = {}
    for zone in (UTC, BERLIN_IN_WINTER):
        with FakeJira(pat=PAT, timezone=zone, clock=lambda: NOW) as jira:
            jira.create_issue(summary="checkout is down", created_at=created)
            headers = {"Authorization": f"Bearer {PAT}"}
            with httpx.Client(base_url=jira.base_url, headers=headers) as client:
                answers[zone] = search(client, DATA_CENTER, jql)
    assert answers[UTC]["issues"] == []
    [issue] = answers[BERLIN_IN_WINTER]["issues"]
    assert issue["fields"]["created"] == "2026-11-30T08:30:00.000+0100"
    assert datetime.fromisoformat(issue["fields"]["created"]) == created


def test_a_relative_date_does_not_depend_on_the_time_zone():
    zone = timezone(timedelta(hours=-8))
    with FakeJira(email=EMAIL, api_token=API_TOKEN, timezone=zone, clock=lambda: NOW) as jira:
        jira.create_issue(summary="recent", created_at=NOW - timedelta(minutes=30))
        with httpx.Client(base_url=jira.base_url, auth=(EMAIL, API_TOKEN)) as client:
            assert keys(search(client, CLOUD, "created >= -45m")) == ["PROJ-1"]


def test_the_timezone_can_be_named():
    with FakeJira(timezone="Europe/Berlin", clock=lambda: NOW) as jira:
        made = jira.create_issue(summary="s", created_at=datetime(2026, 7, 1, 6, 0, tzinfo=UTC))
    assert made["fields"]["created"] == "2026-07-01T08:00:00.000+0200"


# -- projects, issue types, AND, OR, parentheses, ORDER BY ---------------------------------


def test_the_sources_filter_wrapped_in_parentheses_and_created(jira, cloud):
    jira.create_issue(project="PROJ", summary="old", created_at=NOW - timedelta(hours=3))
    recent = jira.create_issue(
        project="PROJ", summary="recent", created_at=NOW - timedelta(minutes=5)
    )
    jira.create_issue(project="OPS", summary="other project", created_at=NOW - timedelta(minutes=5))
    page = search(cloud, CLOUD, "(project = PROJ) AND created >= -90m ORDER BY created ASC")
    assert keys(page) == [recent["key"]]


def test_project_in_a_list_and_not_in_it(jira, data_center):
    for project in ("PROJ", "OPS", "WEB"):
        jira.create_issue(project=project, summary="s")
    assert found(data_center, "project in (PROJ, ops) ORDER BY key") == ["OPS-1", "PROJ-1"]
    assert found(data_center, "project not in (PROJ, OPS)") == ["WEB-1"]
    assert found(data_center, "project != PROJ ORDER BY key") == ["OPS-1", "WEB-1"]
    assert found(data_center, 'project = "10001"') == ["OPS-1"]  # by id, as Jira takes it


def test_issue_type_and_or_inside_parentheses(jira, data_center):
    jira.create_issue(summary="bug", issue_type="Bug")
    jira.create_issue(summary="task")
    jira.create_issue(project="OPS", summary="ops bug", issue_type="Bug")
    jira.create_issue(project="OPS", summary="ops story", issue_type="Story")
    assert found(data_center, "issuetype = Bug ORDER BY key") == ["OPS-1", "PROJ-1"]
    assert found(data_center, "project = OPS AND (issuetype = Bug OR issuetype = Story)") == [
        "OPS-2",
        "OPS-1",
    ]
    # AND binds tighter than OR, as in Jira.
    assert found(data_center, "project = PROJ AND issuetype = Bug OR issuetype = Story") == [
        "OPS-2",
        "PROJ-1",
    ]
    assert found(data_center, "project = PROJ AND NOT issuetype = Bug") == ["PROJ-2"]


def test_order_by_created_either_way_and_the_default(jira, data_center):
    create(jira, 3)
    late = jira.create_issue(
        summary="created first, dated earliest", created_at=NOW - timedelta(days=1)
    )
    assert found(data_center, "project = PROJ ORDER BY created ASC") == [
        late["key"],
        "PROJ-1",
        "PROJ-2",
        "PROJ-3",
    ]
    assert found(data_center, "project = PROJ ORDER BY created DESC") == [
        "PROJ-3",
        "PROJ-2",
        "PROJ-1",
        late["key"],
    ]
    assert found(data_center, "project = PROJ") == found(
        data_center, "project = PROJ ORDER BY created DESC"
    )
    assert found(data_center, "project = PROJ order by key desc") == [
        "PROJ-4",
        "PROJ-3",
        "PROJ-2",
        "PROJ-1",
    ]


def test_order_by_key_sorts_numbers_as_numbers(jira, data_center):
    create(jira, 11)
    assert found(data_center, "project = PROJ ORDER BY key ASC")[-2:] == ["PROJ-10", "PROJ-11"]


# -- fields ----------------------------------------------------------------------------------


def test_cloud_gives_only_ids_unless_fields_are_asked_for(jira, cloud):
    [made] = create(jira, 1)
    page = cloud.get(CLOUD, params={"jql": "project = PROJ"}).json()
    assert page["issues"] == [{"id": made["id"]}]
    assert search(cloud, CLOUD, "project = PROJ", fields="id")["issues"] == [{"id": made["id"]}]


def test_data_center_gives_the_navigable_fields_by_default(jira, data_center):
    create(jira, 1)
    [issue] = data_center.get(DATA_CENTER, params={"jql": "project = PROJ"}).json()["issues"]
    assert list(issue["fields"]) == list(NAVIGABLE)
    assert NAVIGABLE == (
        "summary",
        "description",
        "issuetype",
        "project",
        "status",
        "created",
        "updated",
    )


@pytest.mark.parametrize(
    ("fields", "given"),
    [
        ("summary,created", ["summary", "created"]),
        ("created,summary,nosuchfield", ["summary", "created"]),
        ("*all,-description,-status,-updated", ["summary", "issuetype", "project", "created"]),
        ("-description", ["summary", "issuetype", "project", "status", "created", "updated"]),
        ("*navigable", list(NAVIGABLE)),
    ],
)
def test_only_the_fields_asked_for_are_given_with_id_key_and_self(jira, cloud, fields, given):
    create(jira, 1)
    [issue] = search(cloud, CLOUD, "project = PROJ", fields=fields)["issues"]
    assert list(issue) == ["expand", "fields", "id", "key", "self"]
    assert list(issue["fields"]) == given


def test_repeated_fields_parameters_add_up(jira, cloud):
    create(jira, 1)
    params = [("jql", "project = PROJ"), ("fields", "summary"), ("fields", "created")]
    answer = cloud.get(CLOUD, params=params)
    assert list(answer.json()["issues"][0]["fields"]) == ["summary", "created"]
    assert jira.requests[-1].query["fields"] == "summary,created"


# -- credentials -----------------------------------------------------------------------------


def basic(user: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()


@pytest.mark.parametrize(
    ("path", "authorization"),
    [
        (CLOUD, basic(EMAIL, "wrong-token")),
        (CLOUD, basic("someone@example.com", API_TOKEN)),
        (CLOUD, f"Bearer {API_TOKEN}"),
        (CLOUD, f"Bearer {PAT}"),
        (CLOUD, "Basic not-base64!"),
        (CLOUD, None),
        (CLOUD_V2, basic(EMAIL, "wrong-token")),
        (CLOUD_V2, None),
        (DATA_CENTER, "Bearer wrong-pat"),
        (DATA_CENTER, basic(EMAIL, API_TOKEN)),  # Basic is for Cloud here
        (DATA_CENTER, f"Basic {PAT}"),
        (DATA_CENTER, None),
    ],
)
def test_other_credentials_are_a_401_on_each_endpoint(jira, path, authorization):
    create(jira, 1)
    headers = {"Authorization": authorization} if authorization else {}
    answer = httpx.get(f"{jira.base_url}{path}", params={"jql": "project = PROJ"}, headers=headers)
    assert answer.status_code == 401
    assert answer.json() == {"errorMessages": ["User is not logged in."], "errors": {}}


def test_each_endpoint_takes_its_own_credentials(jira, cloud, data_center):
    create(jira, 1)
    assert cloud.get(CLOUD, params={"jql": "project = PROJ"}).status_code == 200
    assert cloud.get(CLOUD_V2, params={"jql": "project = PROJ"}).status_code == 200
    assert data_center.get(DATA_CENTER, params={"jql": "project = PROJ"}).status_code == 200


# -- a JQL Jira refuses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("jql", "message"),
    [
        ("project = NOPE", "The value 'NOPE' does not exist for the field 'project'."),
        ("project in (PROJ, NOPE)", "The value 'NOPE' does not exist for the field 'project'."),
        ("issuetype = Chore", "The value 'Chore' does not exist for the field 'issuetype'."),
        ("created >= 30/11/2026", "Date value '30/11/2026' for field 'created' is invalid."),
        ("created >= -90x", "Date value '-90x' for field 'created' is invalid."),
        ("assignee = currentUser()", "Field 'assignee' does not exist"),
        ("project > PROJ", "The operator '>' is not supported by the 'project' field."),
        ("project = PROJ ORDER BY priority", "Field 'priority' does not exist"),
        ("project = ", "Error in the JQL Query: Expecting a value but got the end of the query."),
        ("(project = PROJ", "Error in the JQL Query: Expecting ')'"),
        ("project = PROJ AND AND", "Error in the JQL Query: Expecting a field name but got 'AND'."),
        ("project = PROJ project = OPS", "Error in the JQL Query: Expecting either 'OR' or 'AND'"),
        ('project = "PROJ', "Error in the JQL Query: The character '\"' is not expected here."),
        ("project ! PROJ", "Error in the JQL Query:"),
    ],
)
def test_a_jql_it_cannot_run_is_a_400_with_errormessages(jira, cloud, data_center, jql, message):
    create(jira, 1)
    for path, client in ((CLOUD, cloud), (DATA_CENTER, data_center)):
        answer = client.get(path, params={"jql": jql})
        assert answer.status_code == 400, (path, answer.text)
        body = answer.json()
        assert list(body) == ["errorMessages", "errors"] and body["errors"] == {}
        [said] = body["errorMessages"]
        assert said.startswith(message), said


@pytest.mark.parametrize("jql", ["", "ORDER BY created DESC"])
def test_cloud_refuses_an_unbounded_query(jira, cloud, jql):
    create(jira, 1)
    answer = cloud.get(CLOUD, params={"jql": jql})
    assert answer.status_code == 400
    assert answer.json()["errorMessages"][0].startswith("Unbounded JQL queries are not allowed")


def test_jql_keywords_and_field_names_are_case_insensitive(jira, data_center):
    create(jira, 2)
    assert found(data_center, "PROJECT = proj and CREATED >= -1h order by CREATED asc") == [
        "PROJ-1",
        "PROJ-2",
    ]


# -- faults ------------------------------------------------------------------------------------


def test_a_rate_limit_is_a_429_with_retry_after_then_the_answer(jira, cloud):
    create(jira, 1)
    jira.rate_limit_next(2, retry_after=7)
    for _ in range(2):
        limited = cloud.get(CLOUD, params={"jql": "project = PROJ"})
        assert (limited.status_code, limited.headers["Retry-After"]) == (429, "7")
        assert limited.headers["X-RateLimit-Reset"] == "2026-11-30T12:00Z"  # NOW + 7 s
        assert limited.headers["X-RateLimit-Remaining"] == "0"
        assert int(limited.headers["X-RateLimit-Limit"]) > 0
        assert limited.headers["RateLimit-Reason"] == "jira-quota-based"
        assert limited.json()["errors"] == {}
    assert cloud.get(CLOUD, params={"jql": "project = PROJ"}).status_code == 200


def test_the_rate_limit_reset_is_now_plus_retry_after():
    with FakeJira(email=EMAIL, api_token=API_TOKEN, clock=lambda: NOW) as jira:
        jira.rate_limit_next(1, retry_after=90)
        limited = httpx.get(f"{jira.base_url}{CLOUD}", auth=(EMAIL, API_TOKEN))
    assert limited.headers["X-RateLimit-Reset"] == "2026-11-30T12:01Z"


def test_fail_next_answers_server_errors_whatever_is_asked(jira, cloud, data_center):
    create(jira, 1)
    jira.fail_next(3, status=503, retry_after=2)
    asked = [
        cloud.get(CLOUD, params={"jql": "project = PROJ"}),
        data_center.get(DATA_CENTER, params={"jql": "project = PROJ"}),
        httpx.get(f"{jira.base_url}/nowhere"),  # no credentials, no route: still a 503
    ]
    assert [answer.status_code for answer in asked] == [503, 503, 503]
    assert all(answer.headers["Retry-After"] == "2" for answer in asked)
    assert cloud.get(CLOUD, params={"jql": "project = PROJ"}).status_code == 200
    assert len(jira.requests) == 4


def test_a_5xx_is_a_502_by_default_without_retry_after(jira, data_center):
    create(jira, 1)
    jira.fail_next(1)
    answer = data_center.get(DATA_CENTER, params={"jql": "project = PROJ"})
    assert answer.status_code == 502
    assert "Retry-After" not in answer.headers
    assert answer.json() == {"errorMessages": ["Bad Gateway"], "errors": {}}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/rest/api/3/search", 404),  # Cloud's removed search: not served
        ("GET", "/rest/api/3/issue/PROJ-1", 404),
        ("GET", "/rest/api/4/search/jql", 404),
        ("POST", CLOUD, 405),
    ],
)
def test_what_it_does_not_serve(jira, cloud, method, path, status):
    create(jira, 1)
    answer = cloud.request(method, path, params={"jql": "project = PROJ"})
    assert answer.status_code == status
    assert answer.json()["errors"] == {}


# -- the record of requests, a context path, the server itself -----------------------------


def test_every_request_is_recorded(jira, cloud):
    create(jira, 1)
    cloud.get(
        CLOUD,
        params={"jql": "project = PROJ", "maxResults": 5},
        headers={"Accept": "application/json"},
    )
    [request] = jira.requests
    assert (request.method, request.path) == ("GET", CLOUD)
    assert request.query == {"jql": "project = PROJ", "maxResults": "5"}
    assert request.headers["authorization"] == basic(EMAIL, API_TOKEN)
    assert request.headers["accept"] == "application/json"


def test_a_site_below_a_context_path():
    with FakeJira(pat=PAT, context_path="/jira/") as jira:
        jira.create_issue(summary="s")
        assert jira.base_url.endswith("/jira")
        headers = {"Authorization": f"Bearer {PAT}"}
        with httpx.Client(base_url=jira.base_url, headers=headers) as client:
            page = search(client, DATA_CENTER, "project = PROJ")
            at_the_root = client.get(jira.base_url.removesuffix("/jira") + DATA_CENTER)
    assert page["issues"][0]["self"] == f"{jira.base_url}/rest/api/2/issue/10000"
    assert at_the_root.status_code == 404


def test_it_starts_fast_and_stops_with_a_connection_still_open():
    threads_before = set(threading.enumerate())
    began = time.perf_counter()
    jira = FakeJira().start()
    try:
        assert time.perf_counter() - began < 1
        kept_alive = httpx.Client(base_url=jira.base_url)
        assert kept_alive.get("/nowhere").status_code == 404  # the connection stays in the pool
    finally:
        stopping = time.perf_counter()
        jira.stop()
    assert time.perf_counter() - stopping < 1
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(jira.base_url.rsplit(":", 1)[1])), 1)
    assert set(threading.enumerate()) <= threads_before  # no server or handler thread left
    kept_alive.close()

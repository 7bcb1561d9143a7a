"""``python -m bench --set FIELD=N``: sizes overridden, a mistake answered plainly."""

from __future__ import annotations

import pytest

from bench.__main__ import main
from bench.suites import parse_overrides


def test_overrides_are_typed_like_the_sizes_they_replace():
    assert parse_overrides(["e2e_deliveries=5000", "e2e_workers=1,2"]) == {
        "e2e_deliveries": 5000,
        "e2e_workers": (1, 2),
    }
    assert parse_overrides([]) == {}


@pytest.mark.parametrize(
    ("assignment", "said"),
    [
        ("e2e_workers=[2]", "e2e_workers takes a number list"),
        ("e2e_deliveries=lots", "e2e_deliveries takes a number"),
        ("nope=1", "FIELD one of ingress_seconds"),
        ("e2e_deliveries", "expected FIELD=N"),
        ("fairness_cases=1,6", "the cases are 1, 2, 3, 4 and 5"),
    ],
)
def test_a_bad_override_is_a_usage_error_before_anything_starts(assignment, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["e2e", "--set", assignment])
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err

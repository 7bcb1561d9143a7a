"""When a connection plans its fast-path statements anew: at its 64th group,
its 128th, and so on (models.fastpath._Prepared)."""

from models.fastpath import FIRST_REPLAN, _Prepared


def test_a_connection_plans_anew_each_time_its_groups_have_doubled() -> None:
    prepared = _Prepared()
    replans = []
    for group in range(1, 8 * FIRST_REPLAN + 1):
        prepared.names.add("taskhook_claim")
        if prepared.stale():
            replans.append(group)
    assert replans == [FIRST_REPLAN, 2 * FIRST_REPLAN, 4 * FIRST_REPLAN, 8 * FIRST_REPLAN]


def test_what_it_drops_is_what_it_had_prepared_and_it_prepares_afresh() -> None:
    prepared = _Prepared(groups=FIRST_REPLAN - 1)
    prepared.names.update({"taskhook_claim", "taskhook_settle"})
    assert prepared.stale() == {"taskhook_claim", "taskhook_settle"}
    assert prepared.names == set()
    assert prepared.stale() == set()

"""Every benchmark, at its smoke size (about 10 s each), so the harness never rots.

These check that the harness works -- processes start and stop, the load
generator answers, results and charts are written, the counts add up -- never
the performance goals: this machine is shared and CI is noisy. The goals are
measured by ``python -m bench all`` (docs/performance.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from bench.suites import BENCHMARKS, Bench

pytestmark = [pytest.mark.bench, pytest.mark.e2e]


def run(name: str, results: Path, *, overrides: tuple[str, ...] = (), **options) -> dict:
    with Bench(name, "smoke", results, log=lambda line: None, **options) as bench:
        bench.override(list(overrides))
        result = BENCHMARKS[name](bench)
        pids = [process.pid for process in bench.processes.started]
    # Everything it started was stopped, by pid.
    assert not bench.processes.started
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    written = json.loads((results / f"{name}.json").read_text())
    assert written["benchmark"] == name
    assert written["goals"]
    assert (results / f"{name}.png").stat().st_size > 10_000
    return result


def test_ingress(tmp_path: Path) -> None:
    result = run("ingress", tmp_path)
    for name, entry in result["closed_loop"].items():
        for one in entry["runs"]:
            assert one["throughput_rps"] > 0, name
            assert one["errors"] == 0, (name, one["error_kinds"])
    for name, by_rate in result["open_loop"].items():
        for one in by_rate.values():
            assert one["completed"] > 0, name
            assert one["latency"]["p99_ms"] > 0
    assert set(result["ratios"]) == {"vs_tutorial", "vs_minimal_durable"}


def test_end_to_end(tmp_path: Path) -> None:
    result = run("e2e", tmp_path)
    for label, config in result["configs"].items():
        assert config["noop_drain"]["rate_per_s"] > 0, label
        assert config["taskhook_drain"]["rate_per_s"] > 0, label
        assert config["exact"], config["counts"]
        # The CPU each side's workers spent per delivery was counted.
        cpu = config["cpu_ms_per_delivery"]
        assert cpu["noop"]["workers"] > 0 and cpu["taskhook"]["workers"] > 0, cpu
        assert 0 < config["taskhook_drain"]["messages"] <= result["deliveries"]
        assert result["worker_shape"] == {
            "pool": "threads",
            "concurrency": 4,
            "relay_keys_per_message": 16,
        }
    assert all(peak > 0 for peaks in result["peak_rss_mib"].values() for peak in peaks.values())


def test_redelivery_storm(tmp_path: Path) -> None:
    result = run("storm", tmp_path)
    # Correctness, not speed: every delivery became exactly one task, once.
    assert result["goals"]["exactly one task and one create per delivery"], result["storm"]
    for entry in result["duplicate_vs_new"]["rounds"]:
        assert entry["new"]["throughput_rps"] > 0
        assert entry["duplicate"]["throughput_rps"] > 0
        assert (
            entry["duplicate"]["by_answer"]["duplicate"]["count"] == entry["duplicate"]["completed"]
        )


def test_scale(tmp_path: Path) -> None:
    result = run("scale", tmp_path)
    for size, stats in result["create_latency"].items():
        assert stats["creates"] > 0 and stats["p50_ms"] > 0, size
    for size, entry in result["ingress"].items():
        assert entry["throughput_rps_median"] > 0, size


def test_memory(tmp_path: Path) -> None:
    result = run("memory", tmp_path)
    assert result["counts"]["tasks"] == result["deliveries"]
    assert result["peak_rss_mib"]["ingress"] > 0
    assert result["halves"], "too few samples to compare the halves"


def test_embedded_default(tmp_path: Path) -> None:
    result = run("sqlite", tmp_path)
    assert set(result["runs"]) == {"default", "busy_handler", "normal"}
    for side, runs in result["runs"].items():
        (one,) = runs
        assert one["exact"], side
        assert one["tasks"] == one["tasks_settled"] == one["claims"] == result["deliveries"]
        assert one["end_to_end_per_s"] > 0 and one["posted_per_s"] > 0, side
        assert one["cpu_ms_per_delivery"]["worker"] > 0, side
        assert one["worker_messages"] >= 1, side
    assert result["goals"]["busy_handler_vs_default_median"] > 0
    assert result["goals"]["normal_vs_default_median"] > 0


def test_catch_up(tmp_path: Path) -> None:
    result = run("catch-up", tmp_path)
    for name, runs in result["runs"].items():
        for one in runs:
            assert one["recovered"] == result["deliveries"], name
            assert one["rate_per_s"] > 0 and one["peak_rss_mib"] > 0, name
    # A second run finds everything stored: nothing recovered twice.
    assert [again["recovered"] for again in result["reruns"]] == [0]


def test_brokers(tmp_path: Path) -> None:
    result = run("brokers", tmp_path)
    for name, runs in result["runs"].items():
        for one in runs:
            assert one["tasks"] == result["deliveries"], name
            assert one["rate_per_s"] > 0, name
    assert result["goals"]["rabbitmq_vs_redis"] > 0


def test_prune(tmp_path: Path) -> None:
    result = run("prune", tmp_path)
    (entry,) = result["rounds"]
    for what in ("ingress", "drain"):
        for side in ("without", "deleting", "dropping"):
            assert entry[what][side]["rate_per_s"] > 0, (what, side)
        assert entry[what]["ratios"]["deleting"] > 0 and entry[what]["ratios"]["dropping"] > 0
    assert all(entry["ingress"][side]["errors"] == 0 for side in entry["ingress"]["ratios"])
    # Each prune ran beside the load, by its one rule, and worked through an index.
    assert entry["ingress"]["deleting"]["meanwhile"]["rows_deleted"] > 0
    assert entry["ingress"]["deleting"]["meanwhile"]["bodies_dropped"] == 0
    assert entry["ingress"]["dropping"]["meanwhile"]["bodies_dropped"] > 0
    assert entry["ingress"]["dropping"]["meanwhile"]["rows_deleted"] == 0
    assert all("ix_deliveries_status_updated_at" in plan for plan in result["batch_plans"].values())
    assert result["disk_before"]["rows"] == result["rows"]
    assert result["disk_after"]["bodies_dropped"] > 0


def test_messages(tmp_path: Path) -> None:
    result = run("messages", tmp_path)
    assert result["relay_keys_per_message"] == 1
    for label, config in result["configs"].items():
        assert config["exact"], (label, config["counts"])
        # One message per delivery: the relay shared none.
        assert config["taskhook_drain"]["messages"] == result["deliveries"], label
        assert config["noop_drain"]["rate_per_s"] > 0 and config["taskhook_drain"]["rate_per_s"] > 0
    (baseline,) = result["pgbench_bare_create"]["rounds"]
    assert baseline["creates"] > 0 and baseline["clients"] == 8
    assert baseline["cpu_ms_per_create"]["database_backends"] > 0
    assert len(result["postgres_cpu_per_delivery_vs_bare_create"]["ratios_per_round"]) == 1
    # The ceiling: Celery draining one bare create per message, each created and settled once.
    bare = result["bare_create_in_celery"]
    assert bare["exact"] and len(bare["ratios_vs_noop_per_round"]) == 1
    (drained,) = bare["rounds"]
    # Its database CPU is counted after the first tenth of the messages, which a
    # smoke-sized drain may pass before the first look: only its sign is sure.
    assert drained["rate_per_s"] > 0 and drained["database_backends_cpu_ms_per_create"] >= 0
    # The contract's writes in plain SQL, run by pgbench on deliveries stored for it.
    (floor,) = result["pgbench_contract_writes"]["rounds"]
    assert floor["creates"] > 0 and floor["cpu_ms_per_create"]["database_backends"] > 0


def test_workspaces(tmp_path: Path) -> None:
    result = run("workspaces", tmp_path)
    # Every creator process was stopped with its pool.
    pids = result["creator_pids"]
    assert pids and not [pid for pid in pids if psutil.pid_exists(pid)]
    for label, runs in result["runs"].items():
        (one,) = runs
        assert one["calls"] == sum(one["outcomes"].values()) > 0, label
    assert result["found_outcomes"] > 0
    assert result["identifiers"]["gapless"], result["identifiers"]
    assert len(result["ratios_per_round"]) == 1


def test_latency(tmp_path: Path) -> None:
    result = run("latency", tmp_path)
    for stack in ("taskhook", "stock"):
        for rate, one in result["runs"][stack].items():
            # Every delivery answered, and every one's task settled and timed.
            assert one["errors"] == 0 and one["answered"] == one["sent"] > 0, (stack, rate)
            assert one["rows"] == one["settled"] == one["answered"], (stack, rate)
            assert one["drained"] and one["latency"]["p50_ms"] > 0, (stack, rate)
            assert one["cpu_ms_per_delivery"]["worker"] > 0, (stack, rate)
        ramp = result["ramps"][stack]
        assert ramp["steps"] and all(step["answered"] > 0 for step in ramp["steps"]), stack
        assert ramp["highest_flat_rate"] in [0, *(step["rate"] for step in ramp["steps"])]
    # taskhook's rows split the time at the claim.
    for one in result["runs"]["taskhook"].values():
        assert set(one["stages"]) == {"received_to_claimed", "claimed_to_settled"}
    # The machine's speed that day, and each goal against the stock stack's same run.
    assert result["machine_speed"]["noop_drain_per_s"] > 0
    assert len(result["highest_flat_rate"]["ratio_bounds"]) == 2
    assert "p99 at 100/s at most the stock stack's + 5 ms" in result["goals"]


def test_streams(tmp_path: Path) -> None:
    result = run("streams", tmp_path)
    count = result["streams"]
    (one,) = result["rounds"]
    for side in ("with", "without"):
        assert one[side]["completed"] > 0 and one[side]["cpu_ms_per_webhook"] > 0, side
    # Every stream saw every webhook's task.created, once, and each was timed.
    latency = result["latency"]
    assert latency["tasks_settled"] == latency["deliveries"]
    assert latency["events_per_stream"] == [latency["deliveries"]]
    assert latency["arrivals"] == latency["deliveries"] * count
    assert latency["duplicates"] == 0 and latency["latency"]["p99_ms"] > 0
    assert result["exact"]


def test_aliases(tmp_path: Path) -> None:
    result = run("aliases", tmp_path)
    for size, by_what in result["latency"].items():
        for what, stats in by_what.items():
            assert stats["p50_ms"] > 0 and stats["mean_ms"] > 0, (size, what)


def test_retries(tmp_path: Path) -> None:
    result = run("retries", tmp_path)
    for case, runs in result["runs"].items():
        for one in runs:
            assert one["rate_per_s"] > 0, case
    # The mechanism, not the speed: each waiting delivery's message waited in
    # RabbitMQ's delayed-delivery queues, none in the worker.
    assert result["goals"]["every waiting message waits in RabbitMQ"], result["runs"]


def _check_fairness(result: dict, broker: str, cases: set[int]) -> None:
    sizes = result["sizes"]
    measured = result["results"][broker]
    (one,) = measured["rounds"]
    for run_name, loads in one.items():
        for load, entry in loads.items():
            if "latency" in entry:
                # Every delivery answered, stored and settled as a task, and timed.
                assert entry["errors"] == 0, (run_name, load, entry["error_kinds"])
                assert 0 < entry["posted"] <= entry["rows"] == entry["settled"], (run_name, load)
                assert 0 < entry["latency"]["p50_ms"] <= entry["latency"]["p99_ms"], (
                    run_name,
                    load,
                )
            if "drain" in entry:
                assert entry["drain"]["rate_per_s"] > 0, (run_name, load)
            if load.startswith("storm"):
                assert entry["rows"] == sizes["fairness_storm"], run_name
    if 1 in cases:
        # The steady load went on for as long as the storm took to drain.
        storm = one["storm + B"]
        assert storm["steady B"]["rows"] >= 1
        assert one["B alone"]["steady B"]["rows"] >= sizes["fairness_steady_rate"]
    if 2 in cases:
        worst = one["storm + quiet"]["quiet"]["worst_source"]
        assert worst["p99_ms"] > 0 and worst["source"].startswith("fairness-quiet-")
    if 4 in cases:
        for run_name, work in (("catch-up alone", "catch-up"), ("replay + B", "replay")):
            assert one[run_name][work]["handled"] == sizes["fairness_background"], run_name
            assert one[run_name][work]["rate_per_s"] > 0, run_name
    if 5 in cases:
        # B was measured beside the CPU hogs.
        assert one["B beside CPU hogs"]["steady B"]["rows"] >= sizes["fairness_steady_rate"]
    ratios = measured["ratios"]
    expected = {1: 2, 2: 1, 3: 1, 4: 3, 5: 1}
    assert len(ratios) == sum(expected[case] for case in cases)
    assert all(ratio["median"] > 0 for ratio in ratios.values()), ratios
    assert result["goals"][f"{broker} every POST answered"]


def test_fairness(tmp_path: Path) -> None:
    result = run("fairness", tmp_path, brokers=("redis",))
    _check_fairness(result, "redis", {1, 2, 3, 4, 5})


def test_fairness_on_rabbitmq(tmp_path: Path) -> None:
    result = run("fairness", tmp_path, overrides=("fairness_cases=1",), brokers=("rabbitmq",))
    _check_fairness(result, "rabbitmq", {1})


def test_tracing(tmp_path: Path) -> None:
    result = run("tracing", tmp_path)
    assert result["goals"]["every delivery done, both ways"]
    assert result["spans_exported"]["requests"] > 0
    assert result["ratio_on_vs_off"] > 0

"""The machine checks the lessons run first: a thread count that keeps off busy cores, and an honest word when the
machine is too loaded for its timings to be read like the model card's."""

from __future__ import annotations

import json

import pytest

from specdec_lab import machine


def test_threads_leave_busy_cores_alone():
    assert machine.threads_for(2, 0.3) == 2  # quiet: every core
    assert machine.threads_for(2, 1.2) == 1  # one core busy elsewhere
    assert machine.threads_for(2, 6.0) == 1  # never fewer than one
    assert machine.threads_for(8, 2.6) == 5
    assert machine.threads_for(4, None) == 4  # no load figure: assume a quiet machine
    with pytest.raises(ValueError, match="at least 1"):
        machine.threads_for(0, 0.0)


def test_a_slow_forward_or_a_full_machine_is_called_loaded():
    quiet = machine.SpeedCheck(measured_ms=7.0, card_ms=6.6, threads=2, card_threads=2, load=0.4, cores=2,
                               same_machine=True)
    assert not quiet.loaded and "quiet" in quiet.report() and "LOADED" not in quiet.report()
    slow = machine.SpeedCheck(measured_ms=181.0, card_ms=6.6, threads=1, card_threads=2, load=0.9, cores=2,
                              same_machine=True)
    assert slow.slowdown == pytest.approx(181 / 6.6) and slow.loaded
    assert "LOADED" in slow.report() and "below 1x" in slow.report() and "27.4x" in slow.report()
    full = machine.SpeedCheck(measured_ms=6.8, card_ms=6.6, threads=1, card_threads=2, load=3.0, cores=2)
    assert full.loaded  # every core busy: the next timing may meet the load even if this one did not


def test_a_slower_machine_of_another_kind_is_not_called_loaded():
    # A laptop three times slower than the card's machine, quiet by its load average: nothing to rerun.
    laptop = machine.SpeedCheck(measured_ms=20.0, card_ms=6.6, threads=2, card_threads=2, load=0.2, cores=4,
                                same_machine=False)
    assert not laptop.loaded
    assert "LOADED" not in laptop.report() and "rerun" not in laptop.report()
    assert "another kind of machine" in laptop.report() and "not comparable" in laptop.report()
    gpu = machine.SpeedCheck(measured_ms=1.0, card_ms=6.6, threads=2, card_threads=2, load=0.2, cores=4,
                             device="cuda:0")
    assert not gpu.loaded and "cuda:0" in gpu.report()


def test_the_card_is_compared_only_when_it_names_this_machine(tiny_target, tmp_path):
    figures = {"target_forward_ms": 1e-3, "threads": 2}
    (tmp_path / "training.json").write_text(json.dumps({"evaluation": {**figures, "machine": "some other CPU"}}))
    elsewhere = machine.check_speed(tiny_target, zoo_dir=tmp_path, repeats=3, verbose=False)
    assert not elsewhere.same_machine
    assert elsewhere.loaded == (elsewhere.load is not None and elsewhere.load >= elsewhere.cores)
    (tmp_path / "training.json").write_text(json.dumps({"evaluation": {**figures, "machine": machine.machine_kind()}}))
    here = machine.check_speed(tiny_target, zoo_dir=tmp_path, repeats=3, verbose=False)
    assert here.same_machine and here.loaded  # any real forward is far slower than a microsecond


def test_card_figures_come_from_the_zoo(tmp_path):
    assert machine.card_figures()["target_forward_ms"] > 0  # the shipped zoo's card
    (tmp_path / "training.json").write_text(json.dumps({"target": {}}))
    with pytest.raises(ValueError, match="no evaluation"):
        machine.card_figures(tmp_path)


def test_check_speed_times_a_forward_and_reads_the_card(tiny_target, tmp_path, capsys):
    (tmp_path / "training.json").write_text(json.dumps({"evaluation": {"target_forward_ms": 1e-3, "threads": 2,
                                                                       "machine": machine.machine_kind()}}))
    check = machine.check_speed(tiny_target, zoo_dir=tmp_path, repeats=3)
    assert check.measured_ms > 0 and check.card_ms == 1e-3 and check.card_threads == 2
    assert check.loaded  # any real forward is far slower than a microsecond
    assert "LOADED" in capsys.readouterr().out


def test_last_level_cache_is_the_largest_cache_sysfs_lists(tmp_path):
    from specdec_lab.machine import last_level_cache_bytes

    for index, size in enumerate(("32K", "1024K", "32768K", "garbage")):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 32 * 2**20
    assert last_level_cache_bytes(tmp_path / "absent") is None

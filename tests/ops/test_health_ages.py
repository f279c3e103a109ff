"""dl-health's ages (heartbeat, registration): taken when each record is read, by the file
server's clock, and never negative. The table is made after a few seconds of watching the
executors beat; an age computed against a "now" taken before that came out negative for
every heartbeat written meanwhile."""

from __future__ import annotations

from bootstrap_scripts.ops.health import age_of


def test_a_record_written_after_now_was_taken_is_zero_seconds_old_not_negative():
    # the server's clock 0.5 s behind this node's; the heartbeat stamped 2 s "after" now
    assert age_of(1002.0, local_offset=0.5, now=1000.5) == 0.0


def test_an_age_is_this_nodes_clock_less_the_offset_less_the_stamp():
    assert age_of(990.0, local_offset=0.5, now=1000.5) == 10.0

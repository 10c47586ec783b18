from cerebro_spark.backends._placement import rehome, replica_share


def test_rehome_gives_orphans_to_the_least_loaded_oldest_worker():
    holdings = [("w0", {0, 3}), ("w1", {1}), ("w2", {2})]
    assert rehome({4, 5, 6}, holdings) == {"w1": [4], "w2": [5], "w0": [6]}
    assert holdings[1] == ("w1", {1})  # the caller's holdings are not changed


def test_rehome_skips_partitions_held_elsewhere_and_needs_a_live_worker():
    assert rehome({0, 1}, [("w0", {0, 1})]) == {}
    assert rehome({0, 1}, []) == {}


def test_replica_share_prefers_rare_partitions_of_busy_workers():
    holdings = [("w0", {0, 2}), ("w1", {1, 3}), ("w2", {0})]
    # ceil(4 / 4) = 1 partition: a single-held one of the busiest workers, lowest first
    assert replica_share(4, holdings) == [1]
    assert replica_share(4, []) == [0, 1, 2, 3]
    assert replica_share(4, [("w0", {0, 1, 2, 3})]) == [0, 1]

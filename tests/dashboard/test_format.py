"""Every number the dashboard shows is formatted by dashboard.format."""

import math

from dashboard import format as fmt


def test_gib_uses_binary_units_and_one_decimal():
    assert fmt.gib(121 * 2**30) == "121.0 GiB"
    assert fmt.gib(int(63.24 * 2**30)) == "63.2 GiB"
    assert fmt.gib(int(1.5 * 2**30), 2) == "1.50 GiB"


def test_sizes_under_a_gib_read_in_mib_and_under_a_mib_in_kib():
    assert fmt.gib(5 * 2**20) == "5 MiB"
    assert fmt.gib(int(752.4 * 2**20), 2) == "752.4 MiB"
    assert fmt.gib(2**30 - 2**20) == "1023 MiB"
    assert fmt.gib(12 * 2**10) == "12 KiB"
    assert fmt.gib(14) == "14 B"
    assert fmt.gib(0) == "0 B"


def test_throughput_is_decimal_gb_per_second_from_bytes_per_second():
    assert fmt.rate(4.93e9) == "4.93 GB/s"
    assert fmt.rate(16.5e9) == "16.5 GB/s"
    assert fmt.rate(None) == fmt.MISSING


def test_a_ratio_change_that_rounds_to_nothing_is_no_change():
    assert fmt.delta_ratio(1.164, 1.0) == "+0.16×"
    assert fmt.delta_ratio(1.0, 1.16) == "-0.16×"
    assert fmt.delta_ratio(1.001, 1.0) is None
    assert fmt.delta_ratio(None, 1.0) is None


def test_byte_valued_metrics_never_read_as_raw_counts():
    assert fmt.metric_value("memory_limit", 752_414_720) == "717.6 MiB"
    assert fmt.metric_value("peak_footprint", 3 * 2**29) == "1.50 GiB"


def test_missing_values_read_as_a_dash_never_as_zero():
    for formatter in (fmt.gib, fmt.ratio, fmt.percent, fmt.duration, fmt.rate_gbps, fmt.rate):
        assert formatter(None) == fmt.MISSING
        assert formatter(math.nan) == fmt.MISSING


def test_ratio_and_percent_read_like_the_design_notes():
    assert fmt.ratio(1.1634) == "1.16×"
    assert fmt.percent(0.64) == "64%"


def test_duration_is_as_precise_as_a_human_reads_it():
    assert fmt.duration(0.842) == "0.84 s"
    assert fmt.duration(41.24) == "41.2 s"
    assert fmt.duration(412) == "6 min 52 s"
    assert fmt.duration(3780) == "1 h 03 min"


def test_design_metric_names_get_readable_labels_and_units():
    assert fmt.metric_label("footprint_ratio") == "Footprint ratio"
    assert fmt.metric_label("memavailable_cost_ratio") == "MemAvailable cost ratio"
    assert fmt.metric_value("footprint_ratio", 1.004) == "1.00×"
    assert fmt.metric_value("read_efficiency", 0.91) == "91%"
    assert fmt.metric_value("throughput_gbps", 4.93) == "4.93 GB/s"
    assert fmt.metric_value("load_seconds", 12.5) == "12.5 s"
    assert fmt.metric_value("bytes_placed", 2 * 2**30) == "2.00 GiB"


def test_unknown_metric_names_are_derived_from_the_name():
    assert fmt.metric_label("decode_seconds") == "Decode"
    assert fmt.metric_value("frames", 17) == "17"
    assert fmt.metric_value("note", "text") == "text"


def test_size_unit_reads_small_sizes_in_mib_and_the_rest_in_gib():
    assert fmt.size_unit(65 * 2**20) == ("MiB", 2**20)
    assert fmt.size_unit(3 * 2**30) == ("GiB", 2**30)
    assert fmt.size_unit(None) == ("GiB", 2**30)
    assert fmt.size_unit(0) == ("GiB", 2**30)

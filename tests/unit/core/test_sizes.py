import itertools

import pytest

from distbench.core.sizes import (
    MAX_SIZE,
    MAX_SIZES,
    SizeError,
    format_size,
    parse_size,
    parse_sizes,
)

K, M, G, T = 2**10, 2**20, 2**30, 2**40


# --- parse_size ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8", 8),
        ("1", 1),
        ("1K", K),
        ("1k", K),
        ("4KiB", 4 * K),
        ("4kib", 4 * K),
        ("4kb", 4 * K),
        ("4KB", 4 * K),
        ("128M", 128 * M),
        ("128mb", 128 * M),
        ("128MiB", 128 * M),
        ("8G", 8 * G),
        ("8g", 8 * G),
        ("1T", T),
        ("1TiB", T),
        ("512B", 512),
        ("512b", 512),
        ("  64M  ", 64 * M),
        ("4 KiB", 4 * K),
        ("008", 8),
        ("1024K", M),
    ],
)
def test_parse_size_valid(text, expected):
    assert parse_size(text) == expected


def test_size_error_is_value_error():
    assert issubclass(SizeError, ValueError)
    with pytest.raises(ValueError):
        parse_size("nope")


def test_max_size_is_one_tib():
    assert MAX_SIZE == T
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE
    assert parse_size("1024G") == MAX_SIZE


@pytest.mark.parametrize("text", ["", "   ", "\t"])
def test_parse_size_empty(text):
    with pytest.raises(SizeError, match="empty"):
        parse_size(text)


def test_parse_size_unknown_suffix_names_it_and_the_valid_ones():
    with pytest.raises(SizeError) as exc:
        parse_size("1Q")
    said = str(exc.value)
    assert said.startswith("unknown suffix 'Q'") and "'1Q'" in said, said
    assert "K, M, G or T" in said, said


@pytest.mark.parametrize("text", ["1Q", "1P", "1KK", "1iB", "4KiBB", "1Mi", "1bytes", "1BB",
                                  "2KBB"])
def test_parse_size_unknown_suffixes(text):
    with pytest.raises(SizeError, match="unknown suffix"):
        parse_size(text)


@pytest.mark.parametrize("text", ["abc", "K", "1e3", "0x10", "1_000", "+8", "1K2", "--1", "١٢"])
def test_parse_size_non_numeric(text):
    with pytest.raises(SizeError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["0", "0K", "000", "-1", "-1K", "-0"])
def test_parse_size_zero_or_negative(text):
    with pytest.raises(SizeError, match="size must be at least 1 byte"):
        parse_size(text)


@pytest.mark.parametrize("text", ["1.5K", "1.0", "0.5M", "2.K", "1.5"])
def test_parse_size_rejects_fractions(text):
    with pytest.raises(SizeError, match="whole number"):
        parse_size(text)


@pytest.mark.parametrize(
    "text",
    ["1025G", "2T", str(MAX_SIZE + 1), "1099511627777", "99999999999999999999999T", "9" * 5000],
)
def test_parse_size_too_large(text):
    with pytest.raises(SizeError, match="larger than the 1 TiB limit"):
        parse_size(text)


def test_parse_size_huge_never_overflows():
    # A bare OverflowError/ValueError from int() would escape the CLI's SizeError handler.
    with pytest.raises(SizeError) as exc:
        parse_size("99999999999999999999999T")
    assert type(exc.value) is SizeError


# --- format_size --------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (8, "8 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (4096, "4 KiB"),
        (1536, "1.5 KiB"),
        (1280, "1.25 KiB"),
        (1100, "1.07 KiB"),
        (128 * M, "128 MiB"),
        (3 * G, "3 GiB"),
        (T, "1 TiB"),
        (1024 * T, "1024 TiB"),
        (M - 1, "1 MiB"),
        (5 * K + 512, "5.5 KiB"),
    ],
)
def test_format_size(n, expected):
    assert format_size(n) == expected


@pytest.mark.parametrize("text", ["8", "1K", "128M", "3G", "1T"])
def test_format_size_output_parses_back(text):
    n = parse_size(text)
    assert parse_size(format_size(n).replace(" ", "")) == n


# --- parse_sizes: ranges ------------------------------------------------------


def test_factor_range_exact():
    assert parse_sizes("8:128:x2") == [8, 16, 32, 64, 128]


def test_factor_range_to_128m():
    sizes = parse_sizes("8:128M:x2")
    assert sizes[0] == 8
    assert sizes[-1] == 128 * M
    assert len(sizes) == 25
    assert all(b == 2 * a for a, b in itertools.pairwise(sizes))


def test_factor_range_stops_before_overshooting_end():
    assert parse_sizes("1:100:x4") == [1, 4, 16, 64]
    assert parse_sizes("3:100:x3") == [3, 9, 27, 81]


def test_factor_range_uppercase_x_and_whitespace():
    assert parse_sizes(" 1K : 8K : X2 ") == [K, 2 * K, 4 * K, 8 * K]
    assert parse_sizes("1K:8K:x 2") == [K, 2 * K, 4 * K, 8 * K]


def test_huge_factor_gives_only_start():
    assert parse_sizes("1K:1M:x4096") == [K]
    assert parse_sizes("1K:1M:x" + "9" * 5000) == [K]
    assert parse_sizes("1K:1M:x0002") == [K * 2**i for i in range(11)]


def test_two_part_range_defaults_to_factor_two():
    assert parse_sizes("8:128") == [8, 16, 32, 64, 128]
    assert parse_sizes("1M:4M") == [M, 2 * M, 4 * M]


def test_range_start_equals_end():
    assert parse_sizes("64M:64M") == [64 * M]
    assert parse_sizes("4K:4K:+1K") == [4 * K]
    assert parse_sizes("4K:4K:x8") == [4 * K]


def test_full_range_to_limit():
    sizes = parse_sizes("1:1T:x2")
    assert len(sizes) == 41
    assert sizes[-1] == MAX_SIZE


@pytest.mark.parametrize(
    "factor", ["x1", "x0", "x00", "x01", "x1.5", "x", "x-2", "xx2", "x2K", "X1", "x+2"]
)
def test_bad_factor(factor):
    with pytest.raises(SizeError, match="factor must be an integer of at least 2"):
        parse_sizes(f"8:128M:{factor}")


def test_step_range_exact():
    assert parse_sizes("1K:9K:+4K") == [1024, 5120, 9216]


def test_step_range_does_not_pass_end():
    assert parse_sizes("1K:10K:+4K") == [1024, 5120, 9216]


def test_step_range_64k():
    sizes = parse_sizes("1K:64K:+4K")
    assert sizes == list(range(K, 64 * K + 1, 4 * K))
    assert sizes[:3] == [K, 5 * K, 9 * K]
    assert sizes[-1] <= 64 * K
    assert sizes == sorted(sizes)


def test_step_range_with_whitespace():
    assert parse_sizes(" 1 : 4 : + 1 ") == [1, 2, 3, 4]


@pytest.mark.parametrize("step", ["+0", "+-1", "+0K"])
def test_step_must_be_positive(step):
    with pytest.raises(SizeError, match="at least 1 byte"):
        parse_sizes(f"1K:4K:{step}")


@pytest.mark.parametrize("step", ["+1.5K", "+abc", "+1Q"])
def test_step_bad_size(step):
    with pytest.raises(SizeError):
        parse_sizes(f"1K:4K:{step}")


def test_step_missing_after_plus():
    with pytest.raises(SizeError, match="missing step"):
        parse_sizes("1K:4K:+")


@pytest.mark.parametrize("how", ["2", "*2", "-1K", "y2"])
def test_unknown_range_operator(how):
    with pytest.raises(SizeError, match=r"xF .*\+STEP"):
        parse_sizes(f"1K:4K:{how}")


def test_end_smaller_than_start_names_both_sizes():
    with pytest.raises(SizeError) as exc:
        parse_sizes("1M:1K")
    said = str(exc.value)
    assert said.startswith("end 1 KiB ") and "smaller than start 1 MiB" in said, said


@pytest.mark.parametrize("text", ["1M:1K:x2", "1M:1K:+1K", "9:8"])
def test_end_smaller_than_start_all_forms(text):
    with pytest.raises(SizeError, match="is smaller than start"):
        parse_sizes(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (":1M", "missing start"),
        ("1K:", "missing end"),
        (" : ", "missing start"),
        ("1K::x2", "missing end"),
        ("1K:4K:", "missing factor or step"),
        ("1K:4K: ", "missing factor or step"),
        ("1:2:x2:4", "not a range"),
        ("1:2:3:4:5", "not a range"),
    ],
)
def test_malformed_ranges(text, match):
    with pytest.raises(SizeError, match=match):
        parse_sizes(text)


@pytest.mark.parametrize("text", ["0:1K", "1K:2T", "1.5K:4K", "1Q:4K"])
def test_range_endpoints_use_parse_size_rules(text):
    with pytest.raises(SizeError):
        parse_sizes(text)


# --- parse_sizes: the MAX_SIZES limit -----------------------------------------


def test_max_sizes_value():
    assert MAX_SIZES == 1000


def test_step_range_exactly_at_limit_is_accepted():
    sizes = parse_sizes("1:1000:+1")
    assert len(sizes) == MAX_SIZES
    assert sizes == list(range(1, 1001))


def test_step_range_one_over_limit_is_refused():
    with pytest.raises(SizeError, match="1000 limit"):
        parse_sizes("1:1001:+1")


def test_step_range_limit_with_larger_step():
    assert len(parse_sizes("1K:1000K:+1K")) == 1000
    with pytest.raises(SizeError, match="1000 limit"):
        parse_sizes("1K:1001K:+1K")


def test_huge_step_range_is_refused_without_building_it(monkeypatch):
    # Asserting that range() is never called keeps this check free of timing: an
    # implementation that built the list first would hang or run out of memory here.
    import builtins

    import distbench.core.sizes as sizes_mod

    calls = []
    real_range = builtins.range

    def spy_range(*args):
        calls.append(args)
        return real_range(*args)

    monkeypatch.setattr(sizes_mod, "range", spy_range, raising=False)
    with pytest.raises(SizeError, match="1000 limit") as exc:
        parse_sizes("1:1T:+1")
    assert calls == []
    assert str(MAX_SIZE) in str(exc.value)


def test_list_exactly_at_limit_is_accepted():
    text = ",".join(str(i) for i in range(1, MAX_SIZES + 1))
    assert parse_sizes(text) == list(range(1, MAX_SIZES + 1))


def test_list_one_over_limit_is_refused():
    text = ",".join(str(i) for i in range(1, MAX_SIZES + 2))
    with pytest.raises(SizeError, match="1000 limit"):
        parse_sizes(text)


def test_list_limit_counts_distinct_sizes():
    text = ",".join(str(i) for i in range(1, MAX_SIZES + 1)) + ",1,2,3"
    assert len(parse_sizes(text)) == MAX_SIZES


# --- parse_sizes: lists and singles -------------------------------------------


def test_list_keeps_user_order():
    assert parse_sizes("1K,4K,1M") == [K, 4 * K, M]
    assert parse_sizes("1M,1K,4K") == [M, K, 4 * K]


def test_list_drops_duplicates_keeping_first():
    assert parse_sizes("4K,1K,4096,1K,8") == [4 * K, K, 8]


def test_list_whitespace():
    assert parse_sizes(" 1K , 4 KiB ,\t1M ") == [K, 4 * K, M]


@pytest.mark.parametrize("text", ["1K,,4K", "1K,", ",1K", " , ", "1K, ,4K"])
def test_list_empty_entry(text):
    with pytest.raises(SizeError, match="empty entry"):
        parse_sizes(text)


@pytest.mark.parametrize("text", ["1K,1Q", "1K,0", "1K,1.5K", "1K,2T", "1K,abc"])
def test_list_entries_use_parse_size_rules(text):
    with pytest.raises(SizeError):
        parse_sizes(text)


def test_list_unknown_suffix_message_names_the_entry():
    with pytest.raises(SizeError) as exc:
        parse_sizes("1K,1Q")
    said = str(exc.value)
    assert said.startswith("unknown suffix 'Q'") and "'1Q'" in said, said
    assert "1K" not in said, said  # the entry, not the whole list


def test_list_mixed_with_range_is_refused():
    with pytest.raises(SizeError, match="mixes a range"):
        parse_sizes("1K,4K:8K")


def test_single_size():
    assert parse_sizes("64M") == [64 * M]
    assert parse_sizes(" 8 ") == [8]


@pytest.mark.parametrize("text", ["", "   "])
def test_parse_sizes_empty(text):
    with pytest.raises(SizeError, match="empty"):
        parse_sizes(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1Q", "unknown suffix"),
        ("0", "at least 1 byte"),
        ("1.5K", "whole number"),
        ("2T", "1 TiB limit"),
        ("abc", "not a size"),
    ],
)
def test_single_size_errors(text, match):
    with pytest.raises(SizeError, match=match):
        parse_sizes(text)


def test_results_are_plain_ints():
    for text in ("8:1K", "1K:4K:+1K", "1K,2K", "64M"):
        assert all(type(v) is int for v in parse_sizes(text))

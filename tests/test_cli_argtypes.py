"""The argument types every ``rlhf-ext`` subcommand shares: good values pass, bad ones are named."""

import argparse

import pytest

from rlhf_ext.cli import argtypes, build_parser


@pytest.mark.parametrize(
    "fn, text, value",
    [
        (argtypes.positive_int, "3", 3),
        (argtypes.positive_float, "1e-3", 0.001),
        (argtypes.port, "0", 0),
        (argtypes.port, "65535", 65535),
        (argtypes.positive_seconds, "0.5", 0.5),
        (argtypes.probability, "0", 0.0),
        (argtypes.probability, "1", 1.0),
        (argtypes.probability, "0.25", 0.25),
    ],
)
def test_good_values(fn, text, value):
    assert fn(text) == value


@pytest.mark.parametrize(
    "fn, text, message",
    [
        (argtypes.positive_int, "0", "positive integer, got 0"),
        (argtypes.positive_int, "2.5", "positive integer, got '2.5'"),
        (argtypes.positive_float, "0", "positive number, got '0'"),
        (argtypes.positive_float, "nan", "positive number, got 'nan'"),
        (argtypes.positive_float, "x", "expected a number, got 'x'"),
        (argtypes.port, "65536", "0..65535"),
        (argtypes.positive_seconds, "inf", "positive number of seconds"),
        (argtypes.positive_seconds, "-1", "positive number of seconds"),
        (argtypes.probability, "1.5", r"\[0, 1\], got 1.5"),
        (argtypes.probability, "-0.1", r"\[0, 1\], got -0.1"),
        (argtypes.probability, "nan", r"\[0, 1\], got nan"),
        (argtypes.probability, "half", r"\[0, 1\], got 'half'"),
    ],
)
def test_bad_values_are_named(fn, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        fn(text)


def test_data_filter_rejects_a_fraction_outside_0_1(tmp_path, capsys):
    parser = build_parser()
    args = parser.parse_args(["data", "filter", str(tmp_path), "--max-truncated", "0.5", "--output", "x.jsonl"])
    assert args.max_truncated == 0.5
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["data", "filter", str(tmp_path), "--max-truncated", "2", "--output", "x.jsonl"])
    assert exc.value.code == 2
    assert "--max-truncated: expected a number in [0, 1], got 2.0" in capsys.readouterr().err


def test_the_types_live_below_the_tools_and_the_old_path_still_works():
    import rlhf_ext.ground.argtypes as ground
    from rlhf_ext.cli.argtypes import port, positive_float, positive_int, positive_seconds, probability

    assert (port, positive_float, positive_int, positive_seconds, probability) == \
        (ground.port, ground.positive_float, ground.positive_int, ground.positive_seconds, ground.probability)
    assert sorted(argtypes.__all__) == sorted(ground.__all__)

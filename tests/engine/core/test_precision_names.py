"""One precision vocabulary (file, bf16, fp32, int8, int4); the older names are still read."""
import argparse

import pytest

from engine.cli.common import model_options
from engine.core.settings import PRECISIONS, precision_name


def test_the_older_names_map_to_the_one_vocabulary():
    assert precision_name("fast") == "bf16" and precision_name("exact") == "fp32"
    assert [precision_name(p) for p in PRECISIONS] == list(PRECISIONS)


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(ValueError, match="unknown precision 'fp8'; choose from file, bf16, fp32, int8, int4"):
        precision_name("fp8")


def test_the_cli_takes_both_spellings_and_refuses_others(capsys):
    parser = argparse.ArgumentParser()
    model_options(parser)
    assert parser.parse_args(["--precision", "exact"]).precision == "fp32"
    assert parser.parse_args(["--precision", "bf16"]).precision == "bf16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--precision", "fp8"])
    assert "--precision" in capsys.readouterr().err

"""`--config FILE` of the corpus generators (toolkit.cli.parse_with_options_file): the file
sets options, the command line wins, mistakes name the file and the key."""
import argparse

import pytest

from toolkit.cli import parse_with_options_file


def parser():
    p = argparse.ArgumentParser(prog="synth")
    p.add_argument("--keyword", action="append", required=True)
    p.add_argument("--num-train-pos", type=int, default=5)
    p.add_argument("--snr-min", type=float, default=1.0)
    p.add_argument("--test-only", action="store_true")
    return p


def test_file_sets_options_and_the_command_line_wins(tmp_path):
    conf = tmp_path / "corpus.yaml"
    conf.write_text("num_train_pos: 7\nsnr-min: 3\ntest_only: true\n")
    args = parse_with_options_file(parser(), ["--keyword", "a", "--config", str(conf)])
    assert (args.keyword, args.num_train_pos, args.snr_min, args.test_only) == (["a"], 7, 3.0, True)
    # given on the command line, even at its default value, it beats the file
    args = parse_with_options_file(parser(), ["--config", str(conf), "--keyword", "a",
                                              "--num-train-pos", "5"])
    assert args.num_train_pos == 5 and args.snr_min == 3.0
    assert parse_with_options_file(parser(), ["--keyword", "a"]).num_train_pos == 5


def test_repeated_options_come_from_a_list(tmp_path):
    conf = tmp_path / "corpus.yaml"
    conf.write_text("keyword: [hey snips, alexa]\n")
    assert parse_with_options_file(parser(), ["--config", str(conf)]).keyword == \
        ["hey snips", "alexa"]
    assert parse_with_options_file(parser(), ["--config", str(conf), "--keyword", "x"]).keyword == ["x"]


@pytest.mark.parametrize("text, message", [
    ("num_trian_pos: 7\n", "unknown option 'num_trian_pos'"),
    ("num_train_pos: seven\n", "invalid int value: 'seven'"),
    ("test_only: 3\n", "takes true or false"),
    ("- 1\n", "expected a mapping"),
    ("num_train_pos: 7\nnum-train-pos: 8\n", "name the same option"),
])
def test_mistakes_name_the_file_and_the_key(tmp_path, capsys, text, message):
    conf = tmp_path / "corpus.yaml"
    conf.write_text(text)
    with pytest.raises(SystemExit):
        parse_with_options_file(parser(), ["--keyword", "a", "--config", str(conf)])
    err = capsys.readouterr().err
    assert message in err and (str(conf) in err)


def test_required_options_are_still_required(tmp_path, capsys):
    conf = tmp_path / "corpus.yaml"
    conf.write_text("num_train_pos: 7\n")
    with pytest.raises(SystemExit):
        parse_with_options_file(parser(), ["--config", str(conf)])
    assert "--keyword" in capsys.readouterr().err

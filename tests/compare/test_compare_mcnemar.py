import json

import pytest

from tokenpo.compare.mcnemar import main, mcnemar_exact_p


@pytest.mark.parametrize(("only_a", "only_b", "p"), [
    (1, 5, 14 / 64),  # 2 * (C(6,0) + C(6,1)) / 2^6
    (5, 1, 14 / 64),
    (0, 4, 2 / 16),
    (3, 3, 1.0),  # the doubled tail passes 1
    (0, 0, 1.0),  # no discordant problem: nothing changed
    (14, 20, 0.39153),  # 2 * P(X <= 14), X ~ Bin(34, 1/2)
])
def test_exact_mcnemar_p(only_a, only_b, p):
    assert mcnemar_exact_p(only_a, only_b) == pytest.approx(p, abs=5e-6)


def write_eval(path, verdicts):
    records = [{"uid": f"arith/{i}", "greedy_correct": correct} for i, correct in enumerate(verdicts)]
    path.write_text(json.dumps({"metrics": {}, "records": records}))
    return str(path)


def test_cli_pairs_problems_by_uid(tmp_path, capsys):
    # problems 0-5: right, right, wrong, wrong, right, wrong -> wrong, right, right, right, right, right
    a = write_eval(tmp_path / "a.json", [True, True, False, False, True, False])
    b = write_eval(tmp_path / "b.json", [False, True, True, True, True, True])
    assert main([a, b]) == 0
    assert capsys.readouterr().out.strip() == (
        "n=6 accuracy 0.500 -> 0.833 (+0.333); only first right 1, only second right 3; exact McNemar p = 0.625")


def test_cli_refuses_files_of_other_problems_or_formats_in_one_line(tmp_path, capsys):
    a = write_eval(tmp_path / "a.json", [True, False])
    b = write_eval(tmp_path / "b.json", [True, False, True])
    assert main([a, b]) == 1
    assert capsys.readouterr().err.strip() == "mcnemar: the files hold different problems (1 uids in one only)"
    (tmp_path / "c.json").write_text('{"metrics": {}}')
    assert main([a, str(tmp_path / "c.json")]) == 1
    assert capsys.readouterr().err.startswith("mcnemar: not an evaluation file with greedy verdicts (KeyError")

"""Reading local data files: text that is not UTF-8 is one line naming the file and the offset of the bad byte."""

import pytest

from tokenpo.data.files import read_rows
from tokenpo.errors import ConfigError

GOOD_LINE = b'{"problem": "ok", "answer": "1"}\n'  # 33 bytes


@pytest.mark.parametrize(("name", "content", "offset"), [
    # past the decoder's first read buffer: the offset counts from the start of the file
    ("rows.jsonl", GOOD_LINE * 1000 + b'{"problem": "caf\xe9", "answer": "2"}\n', 33 * 1000 + 16),
    ("rows.json", b'[{"problem": "caf\xe9", "answer": "2"}]', 17),
    ("rows.csv", b"problem,answer\n" + b"ok,1\n" * 3000 + b"caf\xe9,2\n", 15 + 5 * 3000 + 3),
])
def test_latin1_byte_is_named_with_its_file_offset(tmp_path, name, content, offset):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        list(read_rows(path))
    assert str(err.value) == (f"data.path {path} is not UTF-8 text: byte {offset} is 0xe9 (invalid continuation "
                              "byte); re-save the file as UTF-8")


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json", "rows.csv", "rows.parquet"])
def test_an_empty_file_is_named_as_empty_whatever_its_format(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        list(read_rows(path))
    assert str(err.value) == f"data.path {path} is empty (0 bytes)"


@pytest.mark.parametrize(("name", "content", "what"), [
    ("rows.jsonl", GOOD_LINE + b'["ok", "1"]\n', "line 2 holds a list, expected an object"),
    ("rows.json", b'{"problem": "ok", "answer": "1"}', "holds an object, expected a JSON list of objects"),
    ("rows.json", b'[{"problem": "ok", "answer": "1"}, "ok"]', "item 1 holds a str, expected an object"),
])
def test_a_row_that_is_not_an_object_is_named_with_its_place(tmp_path, name, content, what):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        list(read_rows(path))
    assert str(err.value) == f"data.path {path} {what}"

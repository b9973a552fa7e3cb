"""Tests for xformopt.data: formats, column guessing, label mapping, sampling and errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from xformopt.data import load_text_dataset
from xformopt.errors import InputError

SENTIMENT = {"NEGATIVE": 0, "POSITIVE": 1}


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write(path, "".join(json.dumps(r) + "\n" for r in rows))


def load_error(path, **kwargs) -> str:
    """Load expecting an InputError; return its message after checking it is one line."""
    with pytest.raises(InputError) as info:
        load_text_dataset(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_code == 2
    return message


@pytest.fixture
def numbered_csv(tmp_path: Path) -> Path:
    rows = "".join(f"example {i},{i % 2}\n" for i in range(50))
    return write(tmp_path / "numbered.csv", "text,label\n" + rows)


# --------------------------------------------------------------------------- formats


def test_csv_loads_texts_labels_and_bookkeeping(tmp_path):
    path = write(tmp_path / "data.csv", 'text,label\ngreat film,1\n"bad, long\nfilm",0\n')
    ds = load_text_dataset(path)
    assert ds.texts == ["great film", "bad, long\nfilm"]
    assert ds.labels == [1, 0]
    assert ds.text_pairs is None
    assert ds.label_names == {0: "0", 1: "1"}
    assert ds.row_ids == [0, 1]
    assert len(ds) == 2
    assert str(path) in ds.source and "'text'" in ds.source and "'label'" in ds.source


def test_csv_with_bom_and_blank_lines(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufefftext,label\r\n\r\nfine,1\r\n".encode())
    ds = load_text_dataset(path)
    assert ds.texts == ["fine"] and ds.labels == [1]


def test_tsv_keeps_quotes_as_text(tmp_path):
    # GLUE-style TSV: no quoting, so a leading quote must not swallow the following rows
    path = write(tmp_path / "dev.tsv", 'sentence\tlabel\n"quoted start\t1\nplain\t0\n')
    ds = load_text_dataset(path)
    assert ds.texts == ['"quoted start', "plain"]
    assert ds.labels == [1, 0]


def test_jsonl_loads(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": 1}])
    ds = load_text_dataset(path)
    assert ds.texts == ["a", "b"] and ds.labels == [0, 1]


def test_json_lines_and_json_array(tmp_path):
    rows = [{"content": "x", "y": "POSITIVE"}, {"content": "z", "y": "NEGATIVE"}]
    as_lines = write_jsonl(tmp_path / "lines.json", rows)
    as_array = write(tmp_path / "array.json", json.dumps(rows, indent=2))
    for path in (as_lines, as_array):
        ds = load_text_dataset(path, label2id=SENTIMENT)
        assert ds.texts == ["x", "z"] and ds.labels == [1, 0]


def test_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    single = datasets.Dataset.from_dict({"sentence": ["a", "b"], "label": [0, 1]}, features=features)
    single.save_to_disk(str(tmp_path / "single"))
    ds = load_text_dataset(tmp_path / "single")
    assert ds.texts == ["a", "b"] and ds.labels == [0, 1]
    assert ds.label_names == {0: "neg", 1: "pos"}  # ClassLabel names are used when the model gives none

    hidden = datasets.Dataset.from_dict({"sentence": ["t"], "label": [-1]})
    dev = datasets.Dataset.from_dict({"sentence": ["v1", "v2"], "label": [1, 0]})
    datasets.DatasetDict({"train": dev, "validation": dev, "test": hidden}).save_to_disk(str(tmp_path / "glue"))
    picked = load_text_dataset(tmp_path / "glue")
    assert picked.texts == ["t"] and picked.labels is None  # test first; its -1 labels mean "hidden"
    assert "'test'" in picked.source
    assert load_text_dataset(f"{tmp_path / 'glue'}::validation").labels == [1, 0]
    assert "PATH::validation" in load_error(tmp_path / "glue", require_labels=True)
    assert "train, validation, test" in load_error(f"{tmp_path / 'glue'}::dev")


def test_datasets_directory_without_library(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    directory = tmp_path / "saved"
    directory.mkdir()
    write(directory / "dataset_dict.json", '{"splits": ["test"]}')
    assert "pip install datasets" in load_error(directory)


def test_plain_directory_and_unknown_extension(tmp_path):
    assert "save_to_disk" in load_error(tmp_path)
    message = load_error(write(tmp_path / "data.parquet", "x"))
    assert ".csv" in message and ".tsv" in message and ".jsonl" in message


def test_split_suffix_on_a_file_is_rejected(tmp_path):
    path = write(tmp_path / "data.csv", "text\na\n")
    assert "drop the '::' suffix" in load_error(f"{path}::test")


# --------------------------------------------------------------------------- columns


def test_named_column_missing_lists_columns_and_flag(tmp_path):
    path = write(tmp_path / "data.csv", "body,stars\nhi,1\n")
    message = load_error(path, text_column="text")
    assert "'text'" in message and "body, stars" in message and "--text-column" in message
    assert "--label-column" in load_error(path, text_column="body", label_column="label")
    assert "--text-pair-column" in load_error(path, text_column="body", text_pair_column="other")


def test_named_column_suggests_case_variant(tmp_path):
    path = write(tmp_path / "data.csv", "Review,label\nhi,1\n")
    assert "did you mean 'Review'" in load_error(path, text_column="review")


def test_failed_text_guess(tmp_path):
    path = write(tmp_path / "data.csv", "a,b,c\n1,2,3\n")
    message = load_error(path)
    assert message == f"no text column in {path} (columns: a, b, c); pass --text-column NAME"


def test_guess_ignores_case_and_explicit_columns_work(tmp_path):
    path = write(tmp_path / "data.csv", "Text,Label,body\nup,1,other\n")
    ds = load_text_dataset(path)
    assert ds.texts == ["up"] and ds.labels == [1]
    assert load_text_dataset(path, text_column="body").texts == ["other"]


def test_label_column_absent_optional_or_required(tmp_path):
    path = write(tmp_path / "data.csv", "text\nonly text\n")
    ds = load_text_dataset(path)
    assert ds.labels is None and ds.label_names is None
    assert "no label column" in load_error(path, require_labels=True)


def test_empty_label_column_name_disables_labels(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\na,1\n")
    assert load_text_dataset(path, label_column="").labels is None
    assert "--label-column" in load_error(path, label_column="", require_labels=True)


def test_pair_columns(tmp_path):
    path = write(tmp_path / "mrpc.tsv", "sentence1\tsentence2\tlabel\nA\tB\t1\nC\tD\t0\n")
    ds = load_text_dataset(path)
    assert ds.texts == ["A", "C"] and ds.text_pairs == ["B", "D"]
    assert load_text_dataset(path, text_pair_column="").text_pairs is None

    nli = write_jsonl(tmp_path / "nli.jsonl", [{"premise": "p", "hypothesis": "h", "label": 2}])
    ds = load_text_dataset(nli)
    assert ds.texts == ["p"] and ds.text_pairs == ["h"]

    custom = write(tmp_path / "custom.csv", "left,right\nx,y\n")
    ds = load_text_dataset(custom, text_column="left", text_pair_column="right")
    assert ds.text_pairs == ["y"]
    assert load_text_dataset(custom, text_column="left").text_pairs is None  # "right" is not a pair name


# --------------------------------------------------------------------------- labels


def test_label_names_map_through_label2id(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\na,positive\nb,NEGATIVE\nc, Positive \n")
    ds = load_text_dataset(path, label2id=SENTIMENT)
    assert ds.labels == [1, 0, 1]
    assert ds.label_names == {0: "NEGATIVE", 1: "POSITIVE"}


def test_case_ambiguous_label_is_rejected(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\na,pos\n")
    assert "spell it exactly" in load_error(path, label2id={"Pos": 0, "POS": 1})


def test_unknown_label_lists_known_labels(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\na,POSITIVE\nb,neutral\nc,neutral\n")
    message = load_error(path, label2id=SENTIMENT)
    assert "'neutral' (line 3)" in message
    assert "0=NEGATIVE" in message and "1=POSITIVE" in message


def test_integer_labels(tmp_path):
    rows = [{"text": "a", "label": 2}, {"text": "b", "label": "0"}, {"text": "c", "label": 1.0}]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    assert load_text_dataset(path).labels == [2, 0, 1]
    with_model = load_text_dataset(path, label2id={"a": 0, "b": 1, "c": 2})
    assert with_model.labels == [2, 0, 1] and with_model.label_names == {0: "a", 1: "b", 2: "c"}


def test_integer_label_outside_model_ids(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\na,0\nb,2\n")
    message = load_error(path, label2id=SENTIMENT)
    assert "line 3" in message and "label id 2" in message and "1=POSITIVE" in message


def test_names_without_label2id_get_sorted_ids(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\na,spam\nb,ham\nc,spam\n")
    ds = load_text_dataset(path)
    assert ds.labels == [1, 0, 1] and ds.label_names == {0: "ham", 1: "spam"}


def test_mixed_ids_and_names_without_label2id(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\na,1\nb,spam\n")
    assert "mixes ids" in load_error(path)


def test_missing_and_hidden_labels(tmp_path):
    partial = write(tmp_path / "partial.csv", "text,label\na,1\nb,\n")
    assert "line 3" in load_error(partial)
    hidden = write(tmp_path / "hidden.csv", "text,label\na,-1\nb,-1\n")
    assert load_text_dataset(hidden).labels is None  # guessed column without gold labels
    assert "has no labels" in load_error(hidden, require_labels=True)
    assert "has no labels" in load_error(hidden, label_column="label")


def test_non_class_label_is_rejected(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [{"text": "a", "label": 0.5}])
    assert "not a class id" in load_error(path)


# --------------------------------------------------------------------------- sampling


def test_limit_is_deterministic_and_keeps_file_order(numbered_csv):
    first = load_text_dataset(numbered_csv, limit=10, seed=3)
    again = load_text_dataset(numbered_csv, limit=10, seed=3)
    other = load_text_dataset(numbered_csv, limit=10, seed=4)
    assert first == again
    assert len(first) == 10 and first.row_ids == sorted(first.row_ids)
    assert first.texts == [f"example {i}" for i in first.row_ids]
    assert first.labels == [i % 2 for i in first.row_ids]
    assert other.row_ids != first.row_ids
    assert "limit 10" in first.source and "seed 3" in first.source


def test_limit_larger_than_file_and_invalid_limit(numbered_csv):
    assert load_text_dataset(numbered_csv, limit=500).row_ids == list(range(50))
    assert "--limit" in load_error(numbered_csv, limit=0)


def test_split_is_disjoint_and_deterministic(numbered_csv):
    ds = load_text_dataset(numbered_csv)
    train, held_out = ds.split(0.8, seed=1)
    assert len(train) == 40 and len(held_out) == 10
    assert not set(train.row_ids) & set(held_out.row_ids)
    assert sorted(train.row_ids + held_out.row_ids) == list(range(50))
    assert ds.split(0.8, seed=1) == (train, held_out)
    assert ds.split(0.8, seed=2)[1].row_ids != held_out.row_ids


def test_split_with_labels_is_stratified_and_keeps_row_order(tmp_path):
    # 30 rows of label 0, 10 of label 1 (every 4th row): a 0.5 split puts 15 + 5 in each part
    rows = "".join(f"example {i},{int(i % 4 == 0)}\n" for i in range(40))
    ds = load_text_dataset(write(tmp_path / "skewed.csv", "text,label\n" + rows))
    for seed in range(5):
        a, b = ds.split(0.5, seed=seed)
        assert (sorted(a.labels), sorted(b.labels)) == ([0] * 15 + [1] * 5, [0] * 15 + [1] * 5)
        assert a.row_ids == sorted(a.row_ids) and b.row_ids == sorted(b.row_ids)
        assert a.labels == [int(i % 4 == 0) for i in a.row_ids] and "stratified by label" in a.source
    assert ds.split(0.5, seed=0) == ds.split(0.5, seed=0) and ds.split(0.5, seed=0) != ds.split(0.5, seed=1)


def test_split_falls_back_to_random_where_stratifying_cannot_work(tmp_path):
    # label 1 has a single row: it cannot be in both parts, so the split is a plain random one
    rows = "".join(f"example {i},{int(i == 7)}\n" for i in range(10))
    ds = load_text_dataset(write(tmp_path / "lone.csv", "text,label\n" + rows))
    a, b = ds.split(0.5, seed=0)
    assert len(a) == len(b) == 5 and sorted(a.row_ids + b.row_ids) == list(range(10))
    assert "stratified" not in a.source
    unlabeled = load_text_dataset(write(tmp_path / "plain.csv", "text\n" + "".join(f"t {i}\n" for i in range(10))))
    c, d = unlabeled.split(0.3, seed=0)
    assert (len(c), len(d)) == (3, 7) and "stratified" not in c.source


def test_split_of_a_limited_sample_keeps_original_row_ids(numbered_csv):
    sample = load_text_dataset(numbered_csv, limit=20, seed=0)
    a, b = sample.split(0.5, seed=0)
    assert set(a.row_ids) | set(b.row_ids) == set(sample.row_ids)
    assert a.texts == [f"example {i}" for i in a.row_ids]


def test_split_rejects_bad_fraction_and_tiny_data(numbered_csv):
    ds = load_text_dataset(numbered_csv)
    for fraction in (0, 1, 1.5):
        with pytest.raises(InputError):
            ds.split(fraction, seed=0)
    with pytest.raises(InputError):
        ds.subset([0]).split(0.5, seed=0)


def test_subset(numbered_csv):
    ds = load_text_dataset(numbered_csv)
    sub = ds.subset([5, 2])
    assert sub.texts == ["example 5", "example 2"] and sub.row_ids == [5, 2] and sub.labels == [1, 0]
    assert sub.source.endswith("subset of 2 rows") and sub.path == ds.path
    with pytest.raises(IndexError):
        ds.subset([-1])


# --------------------------------------------------------------------------- bad files


def test_empty_file_and_header_only(tmp_path):
    assert "has no rows" in load_error(write(tmp_path / "empty.csv", ""))
    assert "has no rows" in load_error(write(tmp_path / "header.csv", "text,label\n"))
    assert "has no rows" in load_error(write(tmp_path / "empty.jsonl", "\n\n"))


def test_missing_path(tmp_path):
    missing = tmp_path / "nope.csv"
    assert load_error(missing) == f"data file not found: {missing}"


def test_malformed_json_line(tmp_path):
    path = write(tmp_path / "data.jsonl", '{"text": "a"}\n{"text": oops}\n')
    message = load_error(path)
    assert "line 2" in message and "not valid JSON" in message
    not_object = write(tmp_path / "list.jsonl", '{"text": "a"}\n["b"]\n')
    assert "line 2" in load_error(not_object)


def test_malformed_csv(tmp_path):
    unclosed = write(tmp_path / "quote.csv", 'text,label\nok,1\n"never closed,0\n')
    assert "line 3" in load_error(unclosed)
    too_many = write(tmp_path / "fields.csv", "text,label\nok,1\nhello, world,0\n")
    message = load_error(too_many)
    assert "line 3" in message and "3 fields" in message
    duplicate = write(tmp_path / "dup.csv", "text,text\na,b\n")
    assert "appears twice" in load_error(duplicate)


def test_empty_text_names_the_row(tmp_path):
    path = write(tmp_path / "data.csv", "text,label\nfine,1\n  ,0\n")
    assert "line 3" in load_error(path)
    missing = write_jsonl(tmp_path / "data.jsonl", [{"text": "a"}, {"label": 1}])
    assert "line 2" in load_error(missing)


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text\ncaf\xe9\n".encode("latin-1"))
    assert "UTF-8" in load_error(path)

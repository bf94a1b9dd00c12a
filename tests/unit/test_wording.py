"""#81 E5: messages in plain English — "an index", "1 dead letter", rows numbered from 1 as an
editor shows them."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest



def test_counts_and_articles_read_as_english(tmp_path):
    from specrag.jobio.run_folder import reconciliation_line
    from specrag.jobio.run_folder import read_manifest
    line = reconciliation_line({"input_rows": 3, "results": 2, "dead_letters": 1, "unreadable_files": 0,
                                "lost": 0, "duplicated": 0})
    assert "1 dead letter " in line or line.endswith("1 dead letter"), line
    with pytest.raises(ValueError, match=r"is not an index \(no manifest.json\)"):
        read_manifest(str(tmp_path), "index", "specrag build-index ...")
    from specrag.inference.vllm import VllmBackend
    with pytest.raises(ValueError, match="all-minilm-l6-v2 is an encoder model"):
        VllmBackend("all-minilm-l6-v2")


def test_a_rows_place_is_numbered_from_one(tmp_path):
    from specrag.transforms.parquet_io import ROW_BITS, ReadParquetRows
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "x"}, {"id": "b", "question": "y"}]),
                   tmp_path / "q.parquet")
    read = ReadParquetRows(str(tmp_path / "q.parquet"))
    assert read.source_of(0) == f"{tmp_path / 'q.parquet'} row 1"
    assert read.source_of(1) == f"{tmp_path / 'q.parquet'} row 2"
    assert read.source_of((0 << ROW_BITS) | 1).endswith(" row 2")

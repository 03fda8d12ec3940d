"""Formats found from the bytes (stdin, unknown or no extension), and gzip and zstd inputs and outputs."""

from __future__ import annotations

import gzip
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from click.testing import CliRunner

from nllbcli.cli import cli
from jobfiles import listing, stopped_after_commits

TRANSLATE = ["translate", "-q", "--src", "eng_Latn", "--tgt", "fra_Latn"]
ROWS = [{"id": 1, "text": "ab"}, {"id": 2, "text": "cd e"}, {"id": 3, "text": "fg"}]
JSONL = "".join(json.dumps(row) + "\n" for row in ROWS).encode()
TRANSLATED = "".join(json.dumps({**row, "translation": row["text"][::-1]}) + "\n" for row in ROWS).encode()
TEXT = b"ab\ncd e\nfg\n"
CSV = b'id,text\n1,ab\n2,"cd e"\n3,fg\n'
TRANSLATED_CSV = b"id,text,translation\n1,ab,ba\n2,cd e,e dc\n3,fg,gf\n"


def translate(*args, input=None):
    return CliRunner().invoke(cli, TRANSLATE + list(args), input=input)


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def parquet_bytes(rows=ROWS) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


def compress(data: bytes, compression: str | None) -> bytes:
    if compression == "gzip":
        return gzip.compress(data)
    if compression == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


def decompress(data: bytes, compression: str | None) -> bytes:
    if compression == "gzip":
        return gzip.decompress(data)
    if compression == "zstd":
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    return data


SUFFIX = {None: "", "gzip": ".gz", "zstd": ".zst"}


def test_jsonl_on_stdin_is_jsonl_and_so_is_stdout(fake):
    result = translate(input=b"\xef\xbb\xbf \n" + JSONL)
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == TRANSLATED


def test_text_on_stdin_stays_text(fake):
    result = translate(input=b"[not json]\n" + TEXT)
    assert result.exit_code == 0
    assert result.stdout == "]nosj ton[\nba\ne dc\ngf\n"


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_parquet_on_stdin_is_parquet(fake, compression):
    result = translate(input=compress(parquet_bytes(), compression))
    assert result.exit_code == 0, result.output
    assert pq.read_table(io.BytesIO(result.stdout_bytes)).to_pylist() == [{**r, "translation": r["text"][::-1]} for r in ROWS]


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_stdin_is_decompressed(fake, compression):
    result = translate(input=compress(JSONL, compression))
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == TRANSLATED
    text = translate(input=compress(TEXT, compression))
    assert text.stdout == "ba\ne dc\ngf\n"


def test_an_explicit_input_format_wins(fake):
    result = translate("--input-format", "text", input=b'{"id": 1}\n')
    assert result.stdout == '}1 :"di"{\n'


@pytest.mark.parametrize("name", ["in", "in.data", "in.log"])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "text"])
@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_a_file_without_a_known_extension_is_sniffed(fake, here, name, fmt, compression):
    content = {"jsonl": JSONL, "parquet": parquet_bytes(), "text": TEXT}[fmt]
    (here / name).write_bytes(compress(content, compression))
    result = translate(name, "out.jsonl")
    assert result.exit_code == 0, result.output
    expected = [{**r, "translation": r["text"][::-1]} for r in ROWS] if fmt != "text" else \
        [{"text": t, "translation": t[::-1]} for t in ["ab", "cd e", "fg"]]
    assert [json.loads(line) for line in open("out.jsonl")] == expected


@pytest.mark.parametrize("extension", [".jsonl", ".ndjson", ".json", ".JSONL"])
@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_json_lines_extensions_compressed_or_not(fake, here, extension, compression):
    source = "in" + extension + SUFFIX[compression]
    (here / source).write_bytes(compress(JSONL, compression))
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "--progress", "json",
                                      source, "out.jsonl"])
    assert result.exit_code == 0, result.output
    assert (here / "out.jsonl").read_bytes() == TRANSLATED
    assert '"total": 3' in result.stderr  # a compressed file is counted too


@pytest.mark.parametrize("fmt,extension", [("jsonl", ".jsonl"), ("text", ".txt"), ("parquet", ".parquet"), ("csv", ".csv"),
                                           ("tsv", ".tsv")])
@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_outputs(fake, here, fmt, extension, compression):
    (here / "in.jsonl").write_bytes(JSONL)
    assert translate("in.jsonl", "plain" + extension).exit_code == 0
    result = translate("in.jsonl", "out" + extension + SUFFIX[compression])
    assert result.exit_code == 0, result.output
    written = (here / ("out" + extension + SUFFIX[compression])).read_bytes()
    assert decompress(written, compression) == (here / ("plain" + extension)).read_bytes()
    assert translate("in.jsonl", "again" + extension + SUFFIX[compression]).exit_code == 0
    assert (here / ("again" + extension + SUFFIX[compression])).read_bytes() == written  # no time or name in it
    assert listing(here) == sorted(["in.jsonl", "plain" + extension, "out" + extension + SUFFIX[compression],
                                    "again" + extension + SUFFIX[compression]])


@pytest.mark.parametrize("extension", [".csv", ".tsv", ".CSV"])
@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_csv_extensions_compressed_or_not(fake, here, extension, compression):
    source = "in" + extension + SUFFIX[compression]
    content = CSV if extension != ".tsv" else CSV.replace(b",", b"\t").replace(b'"', b"")
    (here / source).write_bytes(compress(content, compression))
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "--progress", "json",
                                      source, "out" + extension + SUFFIX[compression]])
    assert result.exit_code == 0, result.output
    written = decompress((here / ("out" + extension + SUFFIX[compression])).read_bytes(), compression)
    assert written == (TRANSLATED_CSV if extension != ".tsv" else TRANSLATED_CSV.replace(b",", b"\t"))
    assert '"total": 3' in result.stderr  # a compressed file is counted too


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_output_to_a_fifo_is_compressed_as_it_goes(fake, here, compression):
    import threading

    (here / "in.txt").write_bytes(TEXT)
    os.mkfifo("out.fifo" + SUFFIX[compression])
    got = []
    reader = threading.Thread(target=lambda: got.append(open("out.fifo" + SUFFIX[compression], "rb").read()))
    reader.start()
    result = translate("in.txt", "out.fifo" + SUFFIX[compression])
    reader.join()
    assert result.exit_code == 0, result.output
    assert decompress(got[0], compression) == b"ba\ne dc\ngf\n"


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
@pytest.mark.parametrize("out", ["out.jsonl.gz", "out.jsonl.zst", "out.parquet.gz", "out.csv.gz"])
def test_compressed_job_resumed_gives_the_same_bytes(fake, here, compression, out):
    """The partial file of a compressed output is plain (cut back to a commit by --resume) and compressed at the
    end; a compressed input is skipped by decompressing up to the saved position."""
    rows = [{"text": f"row {n}"} for n in range(7)]
    source = "in.jsonl" + SUFFIX[compression]
    (here / source).write_bytes(compress("".join(json.dumps(r) + "\n" for r in rows).encode(), compression))
    args = ["--chunk-rows", "2", source, out]
    assert translate(*args).exit_code == 0
    straight = (here / out).read_bytes()
    os.unlink(out)
    with stopped_after_commits(2) as saved:
        assert translate(*args).exit_code == 130
    assert not (here / out).exists() and saved[-1].position.rows == 4
    result = translate(*args, "--resume")
    assert result.exit_code == 0, result.output
    assert (here / out).read_bytes() == straight


def test_binary_input_is_refused_naming_it(fake, here):
    (here / "in.bin").write_bytes(b"PK\x03\x04\x14\x00\x00\x00text")
    result = translate("in.bin", "out.jsonl")
    assert result.exit_code == 2
    assert result.stderr == ("Error: cannot tell the format of INPUT in.bin: it is not Parquet, JSON Lines or text (its "
                             "first bytes are 50 4b 03 04 14 00 00 00, and it holds a NUL byte): name it with "
                             "--input-format.\n")
    assert fake.loaded == []
    result = translate(input=gzip.compress(b"\x00\x01"))
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: cannot tell the format of INPUT <stdin> (gzip-compressed): it is not ")


def test_a_compressed_extension_must_agree_with_the_bytes(fake, here):
    (here / "in.jsonl.gz").write_bytes(JSONL)
    result = translate("in.jsonl.gz", "out.jsonl")
    assert result.exit_code == 1
    assert result.stderr == ("Error: INPUT in.jsonl.gz is named as gzip-compressed, but its first bytes are 7b 22 69 "
                             "64, which is not gzip.\n")


def test_unknown_output_extension_names_the_output_side(fake, here):
    (here / "in.txt").write_bytes(TEXT)
    result = translate("in.txt", "out.xlsx.gz")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: cannot tell the format of OUTPUT out.xlsx.gz from its extension (tried: .xlsx;")
    assert result.stderr.endswith("name it with --output-format.\n")


def test_several_inputs_keep_their_compression_in_the_directory(fake, here):
    (here / "a.jsonl.gz").write_bytes(gzip.compress(JSONL))
    (here / "b.jsonl").write_bytes(JSONL)
    result = translate("--output-format", "text", "-o", "out", "a.jsonl.gz", "b.jsonl")
    assert result.exit_code == 0, result.output
    assert gzip.decompress((here / "out" / "a.txt.gz").read_bytes()) == b"ba\ne dc\ngf\n"
    assert (here / "out" / "b.txt").read_bytes() == b"ba\ne dc\ngf\n"


@pytest.mark.parametrize("damage", ["cut", "garbled"])
@pytest.mark.parametrize("compression", ["gzip", "zstd"])
@pytest.mark.parametrize("ext", [".jsonl", ".txt", ".parquet", ".csv"])
def test_a_damaged_compressed_input_is_named_in_one_line(fake, here, compression, damage, ext):
    content = {".parquet": parquet_bytes(ROWS * 200), ".csv": CSV + CSV[8:] * 400}.get(ext, JSONL * 200)
    content = compress(content, compression)
    content = content[: len(content) // 2] if damage == "cut" else content[:20] + bytes(200) + content[220:]
    (here / ("in" + ext + SUFFIX[compression])).write_bytes(content)
    result = CliRunner().invoke(cli, ["translate", "--src", "eng_Latn", "--tgt", "fra_Latn", "--progress", "json",
                                      "--input-format", "text" if ext == ".txt" else ext[1:], "in" + ext + SUFFIX[compression], "out.jsonl"])
    assert result.exit_code == 1, result.output
    error = result.stderr.splitlines()[-1]
    assert error.startswith(f"Error: cannot read in{ext}{SUFFIX[compression]}: ") and "Traceback" not in result.output, result.output
    assert "out.jsonl" not in listing(here)


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_several_gzip_members_or_zstd_frames_are_one_input(fake, here, compression):
    (here / ("in.jsonl" + SUFFIX[compression])).write_bytes(compress(JSONL[:30], compression) + compress(JSONL[30:], compression))
    assert translate("in.jsonl" + SUFFIX[compression], "out.jsonl").exit_code == 0
    assert (here / "out.jsonl").read_bytes() == TRANSLATED


def skippable_frame(magic_low: int, content: bytes) -> bytes:
    """A zstd skippable frame (magic 0x184D2A50 + magic_low), as pzstd writes one first to index its frames."""
    return (0x184D2A50 + magic_low).to_bytes(4, "little") + len(content).to_bytes(4, "little") + content


@pytest.mark.parametrize("name", ["in.jsonl.zst", "in.jsonl.data", "-"])
@pytest.mark.parametrize("magic_low", [0, 0xF])
def test_a_zstd_input_may_begin_with_skippable_frames(fake, here, name, magic_low):
    content = (skippable_frame(magic_low, b"\0\x10\0\0") + compress(JSONL[:30], "zstd")
               + skippable_frame(0, bytes(300)) + compress(JSONL[30:], "zstd"))
    if name == "-":
        result = translate(input=content)
        assert result.exit_code == 0, result.output
        assert result.stdout_bytes == TRANSLATED
        return
    (here / name).write_bytes(content)
    result = translate(name, "out.jsonl")
    assert result.exit_code == 0, result.output
    assert (here / "out.jsonl").read_bytes() == TRANSLATED

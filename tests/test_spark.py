"""docs/SCALE.md's Spark recipe, run as it is written on a local Spark (CPU, the sample model): every row once, with
translate_table's output and the command's translations; a task that dies is redone without doubling a row; and
the GPU block, as far as a local Spark goes."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pandas", reason="pyspark's mapInArrow imports pandas")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("pyspark needs a Java runtime: java on PATH or JAVA_HOME", allow_module_level=True)

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

import nllbcli
import nllbcli.spark
from nllbcli.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "samples" / "model"
GREEDY = nllbcli.DecodeOptions(beam_size=1)
FILES = [  # a file a partition, and an Arrow batch: each file's rows are numbered as translate_table numbers them
    {"id": [1, 2, 3, 4], "text": ["The concert is on the twelfth of March. Emma's birthday is on the fourth of July.",
                                  "David sees twenty black hats at the market every morning.", "", "  Hello there.\n"],
     "tgt_lang": [None, "deu_Latn", None, None]},
    {"id": [5, 6, 7], "text": [None, "My uncle went to Rome on Friday.", "My sister bought three red cars."],
     "tgt_lang": [None, "xx", None]},
    {"id": [8, 9], "text": ["Emma's birthday is on the fourth of July.", "The concert is on the twelfth of March."],
     "tgt_lang": [None, "ita_Latn"]},
]


def spark_blocks() -> list[str]:
    """The Python blocks of docs/SCALE.md's Spark section: the recipe, then the GPU block."""
    section = (ROOT / "docs" / "SCALE.md").read_text().split("\n## Spark\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def read_rows(path: Path) -> list[dict]:
    return sorted(pq.read_table(path).to_pylist(), key=lambda row: row["id"])


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """The section's first block run in a directory with its input and the sample model at the path it names; the
    session (started here, where the JVM keeps its working directory, and found by the block's getOrCreate)
    allows a task two attempts."""
    from pyspark.sql import SparkSession

    where = tmp_path_factory.mktemp("spark")
    (where / "data" / "samples").mkdir(parents=True)
    (where / "data" / "samples" / "model").symlink_to(SAMPLE)
    (where / "day.parquet").mkdir()
    for n, columns in enumerate(FILES):
        pq.write_table(pa.table(columns, pa.schema([("id", pa.int64()), ("text", pa.string()), ("tgt_lang", pa.string())])),
                       where / "day.parquet" / f"part-{n}.parquet")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", sys.executable)  # the workers run this environment's Python, with nllbcli
        patch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        patch.chdir(where)
        spark = (SparkSession.builder.master("local[2,2]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 # the quick JIT alone and one GC thread: a third less start-up and run time on two cores
                 .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
                 .config("spark.sql.files.openCostInBytes", str(2**30))  # no two files in one partition
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        try:
            namespace: dict = {}
            exec(compile(spark_blocks()[0], "docs/SCALE.md", "exec"), namespace)
            yield where, namespace
        finally:
            spark.stop()


def test_the_recipe_gives_each_row_once_as_translate_table_and_the_command_do(recipe, tmp_path):
    where, namespace = recipe
    assert namespace["spark"].sparkContext.master == "local[2,2]"  # the block found the fixture's session
    assert (where / "day.fr" / "_SUCCESS").exists()
    got = read_rows(where / "day.fr")
    translator = nllbcli.load(str(SAMPLE), "cpu")
    expected = sorted((row for path in sorted((where / "day.parquet").iterdir()) for row in nllbcli.translate_table(
        translator, pq.read_table(path), src="en", tgt="fr", decode=GREEDY, status_field="status",
        error_field="error").to_pylist()), key=lambda row: row["id"])
    assert got == expected
    assert [row["id"] for row in got] == list(range(1, 10))
    failed = {row["id"]: row["error"] for row in got if row["error"] is not None}
    assert failed == {5: "the table: row 1: field 'text' is null, not a string.",
                      6: failed[6]} and "unknown language code 'xx'" in failed[6]
    assert all(got[n - 1]["translation"] is None and got[n - 1]["status"] is None for n in failed)

    table = pa.concat_tables(pq.read_table(path) for path in sorted((where / "day.parquet").iterdir()))
    pq.write_table(table, tmp_path / "in.parquet")
    result = CliRunner().invoke(cli, ["translate", "-q", "-m", str(SAMPLE), "--device", "cpu", "--beam-size", "1",
                                      "--src", "en", "--tgt", "fr", "--on-error", "skip", str(tmp_path / "in.parquet"),
                                      str(tmp_path / "out.parquet")])
    assert result.exit_code == 3, result.output
    assert {row["id"]: row["translation"] for row in pq.read_table(tmp_path / "out.parquet").to_pylist()} == \
        {row["id"]: row["translation"] for row in got if row["error"] is None}


def test_a_worker_keeps_its_model_for_later_tasks(recipe):
    _, namespace = recipe

    def loaded_models(batches):
        import os

        import pyarrow as pa

        import nllbcli.spark

        for _ in batches:
            yield pa.RecordBatch.from_pydict({"pid": [os.getpid()], "models": [repr(sorted(nllbcli.spark.LOADED))]})

    rows = namespace["spark"].range(0, 4, numPartitions=4).mapInArrow(loaded_models, "pid long, models string").collect()
    # the workers that translated, reused: the recipe's model still loaded in each
    assert all("('data/samples/model', 'cpu', None, 'auto', 'bfloat16')" in row.models for row in rows), rows


def test_a_task_that_dies_is_redone_and_its_rows_written_once(recipe):
    where, namespace = recipe
    spark, translate = namespace["spark"], namespace["translate"]

    def dies_on_its_first_attempt(batches):
        from pyspark import TaskContext

        task = TaskContext.get()
        for n, batch in enumerate(translate(batches)):
            if n == 1 and task.attemptNumber() == 0:
                (where / f"died-{task.partitionId()}").touch()
                raise RuntimeError("the first attempt dies after its first batch")
            yield batch

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1")  # a batch a row: each partition has two or more
    try:
        df = spark.read.parquet("day.parquet")
        df.mapInArrow(dies_on_its_first_attempt, translate.schema(df.schema)).write.parquet("day.retried")
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert sorted(path.name for path in where.glob("died-*")) == ["died-0", "died-1", "died-2"]
    first, retried = read_rows(where / "day.fr"), read_rows(where / "day.retried")
    assert [row["id"] for row in retried] == list(range(1, 10))
    assert [(r["translation"], r["error"] is None) for r in retried] == [(r["translation"], r["error"] is None) for r in first]


def test_the_gpu_block_reaches_sparks_scheduler(recipe):
    """Every name and argument of the GPU block is pyspark's and nllbcli's: run here, it stops only where a local
    Spark refuses a resource profile, before any task (so before any model loads)."""
    from py4j.protocol import Py4JJavaError

    namespace = dict(recipe[1])
    exec(compile(spark_blocks()[1], "docs/SCALE.md", "exec"), namespace)
    assert [field.name for field in namespace["out"].schema.fields] == ["id", "text", "tgt_lang", "translation", "error"]
    with pytest.raises(Py4JJavaError, match="ResourceProfiles are only supported on YARN and Kubernetes and Standalone"):
        namespace["out"].collect()


def test_a_table_the_command_refuses_fails_the_job_with_its_reason(recipe):
    from pyspark.errors import PythonException

    _, namespace = recipe
    df = namespace["spark"].read.parquet("day.parquet")
    translate = nllbcli.spark.partition_translator(str(SAMPLE), device="cpu", src="en", tgt="fr", field="body")
    with pytest.raises(PythonException, match="NllbError: the table: no column 'body' to translate"):
        df.mapInArrow(translate, translate.schema(df.schema)).collect()


def test_no_error_column_and_a_misspelt_option_are_refused_on_the_driver():
    with pytest.raises(ValueError, match="needs an error_field: without one, a row that fails would fail its task"):
        nllbcli.spark.partition_translator(str(SAMPLE), error_field=None)
    with pytest.raises(ValueError, match="unexpected keyword argument 'status_feild'"):
        nllbcli.spark.partition_translator(str(SAMPLE), status_feild="status")


def test_the_schema_has_the_score_and_list_columns_translate_table_adds():
    """mapInArrow needs the output's schema before any batch: with scores and several hypotheses, the columns
    translate_table adds, of its types, in its order."""
    from pyspark.sql.types import ArrayType, DoubleType, LongType, StringType, StructField, StructType

    from nllbcli.options import DecodeOptions
    from nllbcli.spark import partition_translator

    given = StructType([StructField("id", LongType()), StructField("text", StringType())])
    decode = DecodeOptions(beam_size=2, num_hypotheses=2, scores=True)
    schema = partition_translator("m", decode=decode, status_field="status", score_field="s").schema(given)
    assert [(f.name, f.dataType) for f in schema.fields] == [
        ("id", LongType()), ("text", StringType()), ("translation", ArrayType(StringType())), ("status", StringType()),
        ("s", ArrayType(DoubleType())), ("log_prob", ArrayType(DoubleType())), ("error", StringType())]
    plain = partition_translator("m").schema(given)
    assert [f.name for f in plain.fields] == ["id", "text", "translation", "error"]
    translator = nllbcli.load(str(Path(__file__).resolve().parent.parent / "data" / "samples" / "model"), "cpu")
    out = nllbcli.translate_table(translator, pa.table({"text": ["Yes."]}), "eng_Latn", "fra_Latn", decode,
                                  status_field="status", score_field="s", error_field="error")
    assert out.column_names == ["text", "translation", "status", "s", "log_prob", "error"]


def test_the_error_column_never_replaces_a_dataframes_own_unless_asked():
    """The default error_field, error, is refused on the driver over an input's error column, as translate_table
    refuses it in each task; a wrong type among the options is refused there too."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from nllbcli.errors import NllbError
    from nllbcli.spark import partition_translator

    given = StructType([StructField("id", LongType()), StructField("text", StringType()), StructField("error", StringType())])
    with pytest.raises(NllbError, match="^the table: it has a column 'error' already, which error_field would replace"):
        partition_translator("m").schema(given)
    assert [f.name for f in partition_translator("m", error_field="failed").schema(given).fields] == \
        ["id", "text", "error", "translation", "failed"]
    assert [f.name for f in partition_translator("m", overwrite_field=True).schema(given).fields] == \
        ["id", "text", "error", "translation"]
    with pytest.raises(TypeError, match=r"^decode must be a DecodeOptions \(nllbcli.DecodeOptions\(beam_size=...\)\) or "
                                        r"None, not dict \{'beam_size': 1\}.$"):
        partition_translator("m", decode={"beam_size": 1})
    with pytest.raises(NllbError, match="^error_field text is field's field too: name another.$"):
        partition_translator("m", error_field="text")

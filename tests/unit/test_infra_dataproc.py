"""infra/dataproc/submit.py builds Dataproc requests of the API's own types (google-cloud-dataproc): a
`SubmitJobRequest` for a cluster, a `CreateBatchRequest` for Serverless, with the jars for the Spark of the
image or runtime and no secret in them; a Spark the job cannot run is refused before anything is uploaded,
and a dry run calls nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from google.cloud import dataproc_v1
from google.protobuf.json_format import ParseError

from ingest.runtime.jars import SUPPORTED_SPARK, maven_packages
from tests.unit.test_infra import (
    ROOT,
    SPARK_40_RUNTIME,
    SPARK_41_RUNTIME,
    assert_no_secret,
    load_tool,
    shipped_files,
    write_pipeline,
)

DATAPROC_SUBMIT = ROOT / "infra" / "dataproc" / "submit.py"
CLUSTER = ["--cluster", "etl-cluster"]
SERVERLESS = ["--serverless"]


@pytest.fixture
def submit() -> ModuleType:
    return load_tool(DATAPROC_SUBMIT, "infra_dataproc_submit")


@pytest.fixture
def pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return write_pipeline(tmp_path, monkeypatch)


class RecordingCloud:
    """Stands in for Google Cloud (the DataprocApi protocol): records every call."""

    def __init__(self, image_version: str = "3.0.5-debian12") -> None:
        self.image_version = image_version
        self.calls: list[tuple[str, Any]] = []

    def get_cluster(self, request: dataproc_v1.GetClusterRequest) -> dataproc_v1.Cluster:
        self.calls.append(("get_cluster", request))
        software = dataproc_v1.SoftwareConfig(image_version=self.image_version)
        return dataproc_v1.Cluster(
            cluster_name=request.cluster_name, config=dataproc_v1.ClusterConfig(software_config=software)
        )

    def upload(self, path: Path, bucket: str, key: str) -> None:
        self.calls.append(("upload", f"gs://{bucket}/{key}"))

    def submit_job(self, request: dataproc_v1.SubmitJobRequest) -> str:
        self.calls.append(("submit_job", request))
        return "submitted"

    def create_batch(self, request: dataproc_v1.CreateBatchRequest) -> str:
        self.calls.append(("create_batch", request))
        return "created"

    @property
    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]


def argv(pipeline: Path, *more: str) -> list[str]:
    base = ["--config", str(pipeline), "--gcs-prefix", "gs://my-bucket/ingest/", "--project", "my-project"]
    return [*base, "--region", "europe-west1", *more]


def dry_run(
    submit: ModuleType, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[dataproc_v1.SubmitJobRequest | dataproc_v1.CreateBatchRequest, str]:
    """Run --dry-run with a recorder; (the printed request read back as its API type, all output)."""
    cloud = RecordingCloud()
    assert submit.main([*args, "--dry-run"], api=cloud) == 0
    assert cloud.calls == [], "a dry run called Google Cloud"
    out, err = capsys.readouterr()
    request_type = dataproc_v1.SubmitJobRequest if "--cluster" in args else dataproc_v1.CreateBatchRequest
    # from_json refuses any field the API's request type does not have.
    return request_type.from_json(out), out + err


def test_cluster_dry_run_prints_a_submit_job_request_with_the_jars_for_the_image(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request, output = dry_run(submit, capsys, *argv(pipeline, *CLUSTER, "--image-version", "3.0-debian12"))

    assert isinstance(request, dataproc_v1.SubmitJobRequest)
    assert (request.project_id, request.region) == ("my-project", "europe-west1")
    assert request.job.placement.cluster_name == "etl-cluster"
    job = request.job.pyspark_job
    assert job.main_python_file_uri == "gs://my-bucket/ingest/ingest_job.py"
    assert list(job.args) == ["--config", "pipeline.yaml", "--until-caught-up"]
    assert list(job.file_uris) == ["gs://my-bucket/ingest/pipeline.yaml"]
    assert list(job.archive_uris) == ["gs://my-bucket/ingest/ingest-env.tar.gz#environment"]
    assert job.properties["spark.jars.packages"] == maven_packages("4.0.1")
    assert job.properties["spark.jars.packages"].startswith(SPARK_40_RUNTIME)
    assert job.properties["spark.pyspark.python"] == "./environment/bin/python"
    assert job.properties["spark.submit.deployMode"] == "cluster"
    assert_no_secret(output)
    assert "INGEST_TEST_FAKE_MYSQL_PASSWORD" in output  # the variable the driver needs, not its value


def test_serverless_dry_run_prints_a_create_batch_request_on_runtime_3(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request, output = dry_run(submit, capsys, *argv(pipeline, *SERVERLESS))

    assert isinstance(request, dataproc_v1.CreateBatchRequest)
    assert request.parent == "projects/my-project/locations/europe-west1"
    assert request.batch.runtime_config.version == "3.0"
    batch = request.batch.pyspark_batch
    assert batch.main_python_file_uri == "gs://my-bucket/ingest/ingest_job.py"
    assert list(batch.args) == ["--config", "pipeline.yaml", "--until-caught-up"]
    assert list(batch.file_uris) == ["gs://my-bucket/ingest/pipeline.yaml"]
    assert list(batch.archive_uris) == ["gs://my-bucket/ingest/ingest-env.tar.gz#environment"]
    properties = request.batch.runtime_config.properties
    assert properties["spark.jars.packages"] == maven_packages("4.0.1")
    assert properties["spark.pyspark.python"] == "./environment/bin/python"
    assert "spark.submit.deployMode" not in properties
    assert_no_secret(output)


def test_dry_run_as_a_script(pipeline: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(DATAPROC_SUBMIT), *argv(pipeline, *SERVERLESS), "--dry-run"],
        capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    request = dataproc_v1.CreateBatchRequest.from_json(done.stdout)
    assert request.batch.runtime_config.properties["spark.jars.packages"].startswith(SPARK_40_RUNTIME)
    assert_no_secret(done.stdout + done.stderr)


@pytest.mark.parametrize("target", [CLUSTER, SERVERLESS], ids=["job", "batch"])
def test_a_spark_version_overrides_the_image_and_picks_its_runtime(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str], target: list[str]
) -> None:
    request, _ = dry_run(submit, capsys, *argv(pipeline, *target, "--spark-version", "4.1.0"))
    if isinstance(request, dataproc_v1.SubmitJobRequest):
        packages = request.job.pyspark_job.properties["spark.jars.packages"]
    else:
        packages = request.batch.runtime_config.properties["spark.jars.packages"]
    assert packages == maven_packages("4.1.0")
    assert packages.startswith(SPARK_41_RUNTIME)


@pytest.mark.parametrize(
    ("target", "refused"),
    [
        ([*CLUSTER, "--image-version", "2.2-debian12"], "Dataproc image 2.2-debian12: Spark 3.5.x is not supported"),
        ([*CLUSTER, "--image-version", "2.3.5-ubuntu22"], "Dataproc image 2.3.5-ubuntu22: Spark 3.5.x"),
        ([*SERVERLESS, "--runtime-version", "2.2"], "Dataproc Serverless runtime 2.2: Spark 3.5.1 is not supported"),
        ([*SERVERLESS, "--runtime-version", "1.2"], "Dataproc Serverless runtime 1.2: Spark 3.5.1"),
    ],
    ids=["image-2.2", "image-2.3", "runtime-2.2", "runtime-1.2"],
)
def test_a_spark_35_platform_is_refused_before_anything_is_uploaded(
    submit: ModuleType,
    pipeline: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: list[str],
    refused: str,
) -> None:
    cloud = RecordingCloud()
    with pytest.raises(SystemExit) as exit_info:
        submit.main(argv(pipeline, *target, *shipped_files(tmp_path)), api=cloud)
    assert exit_info.value.code == 2
    assert cloud.calls == []
    err = capsys.readouterr().err
    assert refused in err
    assert f"Spark {' and '.join(SUPPORTED_SPARK)}" in err


def test_the_image_read_from_the_cluster_is_refused_before_the_upload(
    submit: ModuleType, pipeline: Path, tmp_path: Path
) -> None:
    cloud = RecordingCloud(image_version="2.2.40-debian12")
    with pytest.raises(SystemExit) as exit_info:
        submit.main(argv(pipeline, *CLUSTER, *shipped_files(tmp_path)), api=cloud)
    assert exit_info.value.code == 2
    assert cloud.methods == ["get_cluster"]
    [(_, lookup)] = cloud.calls
    assert (lookup.project_id, lookup.region, lookup.cluster_name) == ("my-project", "europe-west1", "etl-cluster")


@pytest.mark.parametrize(
    ("target", "calls"),
    [(CLUSTER, ["get_cluster", "upload", "upload", "upload", "submit_job"]),
     (SERVERLESS, ["upload", "upload", "upload", "create_batch"])],
    ids=["job", "batch"],
)  # fmt: skip
def test_a_submission_uploads_then_sends_the_request(
    submit: ModuleType, pipeline: Path, tmp_path: Path, target: list[str], calls: list[str]
) -> None:
    cloud = RecordingCloud(image_version="3.0.5-debian12")
    assert submit.main(argv(pipeline, *target, *shipped_files(tmp_path)), api=cloud) == 0

    assert cloud.methods == calls
    uploads = [uri for method, uri in cloud.calls if method == "upload"]
    assert uploads == [
        f"gs://my-bucket/ingest/{name}" for name in ("ingest-env.tar.gz", "ingest_job.py", "pipeline.yaml")
    ]
    request = cloud.calls[-1][1]
    sent = type(request).to_json(request)
    assert SPARK_40_RUNTIME in sent and SPARK_41_RUNTIME not in sent
    assert_no_secret(sent)


def test_an_image_or_runtime_the_tool_does_not_know_needs_a_spark_version(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for target in ([*CLUSTER, "--image-version", "4.0-debian13"], [*SERVERLESS, "--runtime-version", "3.1"]):
        with pytest.raises(SystemExit) as exit_info:
            submit.main([*argv(pipeline, *target), "--dry-run"], api=RecordingCloud())
        assert exit_info.value.code == 2
        assert "give --spark-version" in capsys.readouterr().err

    request, _ = dry_run(
        submit, capsys, *argv(pipeline, *SERVERLESS, "--runtime-version", "3.1", "--spark-version", "4.1.1")
    )
    assert isinstance(request, dataproc_v1.CreateBatchRequest)
    assert request.batch.runtime_config.version == "3.1"
    assert request.batch.runtime_config.properties["spark.jars.packages"].startswith(SPARK_41_RUNTIME)


def test_a_cluster_dry_run_needs_the_image_or_the_spark_version(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        submit.main([*argv(pipeline, *CLUSTER), "--dry-run"], api=RecordingCloud())
    assert exit_info.value.code == 2
    assert "--image-version" in capsys.readouterr().err


def test_the_request_types_reject_a_field_the_api_does_not_have(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The check is not vacuous: the API's types refuse an unknown field or a wrong type, built or read back."""
    with pytest.raises(ValueError, match="Unknown field for PySparkJob: archives"):
        dataproc_v1.PySparkJob(main_python_file_uri="gs://b/job.py", archives=["gs://b/env.tar.gz"])
    with pytest.raises(ValueError, match="Unknown field for RuntimeConfig"):
        dataproc_v1.RuntimeConfig(version="3.0", spark_properties={"a": "b"})
    with pytest.raises(TypeError):
        dataproc_v1.PySparkBatch(main_python_file_uri=42)

    request, _ = dry_run(submit, capsys, *argv(pipeline, *SERVERLESS))
    printed = json.loads(dataproc_v1.CreateBatchRequest.to_json(request))
    printed["batch"]["pysparkBatch"]["archives"] = printed["batch"]["pysparkBatch"].pop("archiveUris")
    with pytest.raises(ParseError, match='no field named "archives"'):
        dataproc_v1.CreateBatchRequest.from_json(json.dumps(printed))
    as_dict = dataproc_v1.CreateBatchRequest.to_dict(request)
    as_dict["batch"]["runtime_config"]["spark_version"] = "4.0"
    with pytest.raises(ValueError, match="Unknown field for RuntimeConfig: spark_version"):
        dataproc_v1.CreateBatchRequest(as_dict)


def test_serverless_options_map_to_the_batch_fields(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options = [
        "--batch", "ingest-orders-1", "--subnet", "projects/p/regions/europe-west1/subnetworks/etl",
        "--service-account", "ingest@my-project.iam.gserviceaccount.com", "--property", "spark.executor.cores=2",
    ]  # fmt: skip
    request, _ = dry_run(submit, capsys, *argv(pipeline, *SERVERLESS, *options))
    assert isinstance(request, dataproc_v1.CreateBatchRequest)
    assert request.batch_id == "ingest-orders-1"
    execution = request.batch.environment_config.execution_config
    assert execution.subnetwork_uri == "projects/p/regions/europe-west1/subnetworks/etl"
    assert execution.service_account == "ingest@my-project.iam.gserviceaccount.com"
    assert request.batch.runtime_config.properties["spark.executor.cores"] == "2"


def test_no_archive_with_a_container_image_ships_no_environment(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = "europe-docker.pkg.dev/my-project/ingest/job:1"
    request, output = dry_run(submit, capsys, *argv(pipeline, *SERVERLESS, "--no-archive", "--container-image", image))
    assert isinstance(request, dataproc_v1.CreateBatchRequest)
    assert request.batch.runtime_config.container_image == image
    assert list(request.batch.pyspark_batch.archive_uris) == []
    assert "spark.pyspark.python" not in request.batch.runtime_config.properties
    assert "ingest-env.tar.gz" not in output


@pytest.mark.parametrize(
    "wrong",
    [
        [*CLUSTER, "--subnet", "etl"],
        [*CLUSTER, "--runtime-version", "3.0"],
        [*SERVERLESS, "--image-version", "3.0"],
        [*SERVERLESS, "--batch", "Not_An_Id"],
        [*SERVERLESS, "--property", "spark.hadoop.fs.gs.auth.client.secret=x"],
        [*SERVERLESS, "--property", "no-value"],
    ],
    ids=["subnet-on-cluster", "runtime-on-cluster", "image-on-batch", "batch-id", "secret-property", "not-key-value"],
)
def test_options_that_do_not_fit_are_refused(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str], wrong: list[str]
) -> None:
    cloud = RecordingCloud()
    with pytest.raises(SystemExit) as exit_info:
        submit.main([*argv(pipeline, *wrong), "--dry-run"], api=cloud)
    assert exit_info.value.code == 2
    assert cloud.calls == []


def test_plain_text_password_in_the_pipeline_file_is_warned_about(
    submit: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text("name: p\nsource: {host: h, user: u, password: hunter2}\n")
    _, output = dry_run(submit, capsys, *argv(path, *SERVERLESS))
    assert "WARNING" in output and "`source.password`" in output


def test_reference_passwords_are_not_warned_about(
    submit: ModuleType, pipeline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, output = dry_run(submit, capsys, *argv(pipeline, *SERVERLESS))
    assert "WARNING" not in output


def test_the_job_package_never_imports_the_google_libraries() -> None:
    """google-cloud-* is the `gcp` extra, for the Dataproc tool only: the job must not need it."""
    code = (
        "import importlib, pkgutil, sys, ingest\n"
        "for m in pkgutil.walk_packages(ingest.__path__, 'ingest.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('google.cloud')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == "[]"
